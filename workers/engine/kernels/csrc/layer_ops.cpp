// The fused stack's per-layer pieces (decoder_layers.cpp), over raw fp32 buffers: transformers'
// RMSNorm and rotary embedding, and the large-batch linears (ATen's GEMM, oneDNN's over an fp32
// weight, oneDNN's bf16 GEMM over a bf16 weight: input rounded to bf16, output widened to fp32).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>

#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace kvferry {

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w, for `rows` rows of `width` (transformers' RMSNorm).
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t width, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * width;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < width; ++c) sum += xr[c] * xr[c];
    const float inv = 1.f / std::sqrt(sum / static_cast<float>(width) + eps);
    float* o = out + r * width;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) o[c] = w[c] * (xr[c] * inv);
  }
}

// x[h] = x[h] * cos + rotate_half(x[h]) * sin for each of `heads` heads of row x ([heads, d]).
void rotary(float* x, const float* cos, const float* sin, int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (int64_t j = 0; j < half; ++j) {
      const float a = v[j], b = v[j + half];
      v[j] = a * cos[j] - b * sin[j];
      v[j + half] = b * cos[j + half] + a * sin[j + half];
    }
  }
}

// out[m, n] = x W^T (+ b) through ATen's CPU GEMM (MKL or oneDNN), which beats kvferry's above a few
// dozen rows (prefill rows in the step), where the product is bound by arithmetic, not by reading W.
void aten_linear(const float* x, int64_t m, const at::Tensor& w, const at::Tensor& b, float* out) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  at::Tensor xt = at::from_blob(const_cast<float*>(x), {m, w.size(1)}, options);
  at::Tensor ot = at::from_blob(out, {m, w.size(0)}, options);
  if (b.numel() > 0)
    at::addmm_out(ot, b, xt, w.t());
  else
    at::mm_out(ot, xt, w.t());
}

namespace {

// out[m, n] = x W^T (+ b) by mkldnn::_linear_pointwise over x in `dtype` (x rounded to it where
// narrower), the output widened into `out`. Boxed: the schema is torch's to change.
void pointwise_linear(const float* x, int64_t m, const at::Tensor& w, const at::Tensor& b, float* out,
                      at::ScalarType dtype) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  const auto options = at::TensorOptions().dtype(at::kFloat);
  torch::jit::Stack stack{at::from_blob(const_cast<float*>(x), {m, w.size(1)}, options).to(dtype),
                          w,
                          b.numel() > 0 ? c10::IValue(b) : c10::IValue(),
                          "none",
                          c10::List<std::optional<at::Scalar>>(),
                          ""};
  op.callBoxed(&stack);
  at::from_blob(out, {m, w.size(0)}, options).copy_(stack[0].toTensor());
}

}  // namespace

// aten_linear through oneDNN over the same plain weight: mkldnn::_linear_pointwise, the op the
// modules' large-batch linears call (packed_linear.py).
void onednn_linear(const float* x, int64_t m, const at::Tensor& w, const at::Tensor& b, float* out) {
  pointwise_linear(x, m, w, b, out, at::kFloat);
}

// The same over a bf16 weight: x rounded to bf16, oneDNN's bf16 GEMM (fp32 accumulation), the
// output widened into `out`.
void onednn_bf16_linear(const float* x, int64_t m, const at::Tensor& w, const at::Tensor& b, float* out) {
  pointwise_linear(x, m, w, b, out, at::kBFloat16);
}

}  // namespace kvferry
