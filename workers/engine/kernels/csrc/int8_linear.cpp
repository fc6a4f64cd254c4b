// The fused stack's int8 weight-only linears (decoder_layers.cpp; kernels/int8_linear.py is the
// modules' side): y = (x q^T) * s + b over per-output-channel int8 weights q and bf16 scales s,
// x rounded to bf16, fp32 accumulation, the output widened to fp32. Two kernels over the same q:
// torch's `_weight_int8pack_mm` (reads the int8 weight) up to the row count int8_linear.py measured
// faster on this CPU, oneDNN's bf16 GEMM over q widened to bf16 (exact) above it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_weight_int8pack_mm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

#include "kernels.h"

namespace kvferry {

void check_int8_linear(const at::Tensor& q, const at::Tensor& s, int64_t out_features, int64_t in_features,
                       bool int8_kernel, int64_t layer, int64_t index) {
  TORCH_CHECK(s.device().is_cpu() && s.scalar_type() == at::kBFloat16 && s.is_contiguous() && s.dim() == 1 &&
                  s.size(0) == out_features,
              "kvferry::decoder_layers: the scales of weight ", index, " of layer ", layer, " must be bf16 [",
              out_features, "]");
  if (!int8_kernel) return;
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kChar && q.is_contiguous() && q.dim() == 2 &&
                  q.size(0) == out_features && q.size(1) == in_features,
              "kvferry::decoder_layers: the int8 copy of weight ", index, " of layer ", layer, " must be int8 [",
              out_features, ", ", in_features, "]");
}

void int8_linear(const float* x, int64_t m, const at::Tensor& w16, const at::Tensor& q, const at::Tensor& s,
                 const at::Tensor& b, float* out, bool int8_kernel) {
  const int64_t nout = s.size(0), k = w16.size(1);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const c10::BFloat16* sp = s.data_ptr<c10::BFloat16>();
  const float* bp = b.numel() > 0 ? b.data_ptr<float>() : nullptr;
  if (int8_kernel) {
    at::Tensor xt = at::from_blob(const_cast<float*>(x), {m, k}, f32).to(at::kBFloat16);
    at::from_blob(out, {m, nout}, f32).copy_(at::_weight_int8pack_mm(xt, q, s));  // scaled
    if (bp == nullptr) return;
    for (int64_t r = 0; r < m; ++r) {
      float* o = out + r * nout;
#pragma omp simd
      for (int64_t c = 0; c < nout; ++c) o[c] += bp[c];
    }
    return;
  }
  static const at::Tensor none = at::empty({0}, f32);
  onednn_bf16_linear(x, m, w16, none, out);
  std::vector<float> scale(nout);
  for (int64_t c = 0; c < nout; ++c) scale[c] = static_cast<float>(sp[c]);
  for (int64_t r = 0; r < m; ++r) {
    float* o = out + r * nout;
    if (bp != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < nout; ++c) o[c] = o[c] * scale[c] + bp[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < nout; ++c) o[c] *= scale[c];
    }
  }
}

}  // namespace kvferry
