// kvferry::skinny_linear: y = x W^T + b for the few rows of a decode step, over the model's own
// [out, in] weight.
//
// A decode step multiplies a handful of rows (one per sequence) by every weight of the model, so
// on CPU it is bound by streaming the weights from memory; a general GEMM blocks for reuse that
// a handful of rows cannot give (oneDNN and MKL read SmolLM2's weights at ~2-5 GB/s at 16 rows
// here). This one reads each weight once per 16 rows: a panel of 6 output features (6 adjacent
// rows of W, one contiguous run of memory) against 16 rows of x held transposed, one weight
// broadcast at a time into 12 accumulators, the next panel prefetched as one linear stream.
// Panels are split across torch's intra-op threads (at::parallel_for). Up to ~128 rows it keeps
// ahead of oneDNN; larger batches (prefill chunks) belong to oneDNN (packed_linear.py).
//
// Written with GCC vector extensions rather than intrinsics: -march=native turns them into AVX2
// FMAs on x86 and NEON on aarch64. fp32 only.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

typedef float vec8 __attribute__((vector_size(32)));
constexpr int64_t NR = 6;  // output features per panel
constexpr int64_t MR = 16;  // rows of x per chunk (two vec8)

// t[i * MR + r] = sum_c w[i * ldw + c] * xt[c * MR + r] for i < NR and J * 8 rows r; `ahead` is
// the next panel, prefetched while this one is multiplied.
template <int J>
inline void micro(const float* __restrict xt, const float* __restrict w, int64_t ldw, int64_t k,
                  const float* ahead, float* __restrict t) {
  vec8 acc[NR][J] = {};
  for (int64_t c = 0; c < k; ++c) {
    if ((c & 1) == 0) __builtin_prefetch(ahead + c * NR, 0, 3);  // NR floats a step: the whole panel
    vec8 x[J];
    for (int j = 0; j < J; ++j) x[j] = *reinterpret_cast<const vec8*>(xt + c * MR + 8 * j);
    for (int i = 0; i < NR; ++i) {
      const float s = w[i * ldw + c];
      const vec8 b = {s, s, s, s, s, s, s, s};
      for (int j = 0; j < J; ++j) acc[i][j] += b * x[j];
    }
  }
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < J; ++j) *reinterpret_cast<vec8*>(t + i * MR + 8 * j) = acc[i][j];
}

}  // namespace

namespace kvferry {

void skinny_gemm(const float* xs, int64_t m, int64_t k, const float* w, int64_t n, const float* b, float* o) {
  if (m == 0 || n == 0) return;
  // x transposed into 16-row chunks [chunks, K, MR], zero past m. Allocations are 64-byte aligned
  // and each chunk is K * 64 bytes, so every vec8 load is aligned.
  const auto options = at::TensorOptions().dtype(at::kFloat);
  const int64_t chunks = (m + MR - 1) / MR;
  at::Tensor xt = at::empty({chunks, k, MR}, options);
  float* xd = xt.data_ptr<float>();
  TORCH_INTERNAL_ASSERT(reinterpret_cast<uintptr_t>(xd) % 32 == 0, "kvferry::skinny_linear: unaligned buffer");
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t rows = std::min(MR, m - ch * MR);
      float* d = xd + ch * k * MR;
      for (int64_t c = 0; c < k; ++c) {
        for (int64_t r = 0; r < rows; ++r) d[c * MR + r] = xs[(ch * MR + r) * k + c];
        for (int64_t r = rows; r < MR; ++r) d[c * MR + r] = 0.f;
      }
    }
  });

  // The last n % NR features, copied into a zero-padded panel of their own.
  const int64_t full = n / NR, panels = (n + NR - 1) / NR;
  at::Tensor tail;
  if (panels > full) {
    tail = at::zeros({NR, k}, options);
    if (k > 0) std::memcpy(tail.data_ptr<float>(), w + full * NR * k, sizeof(float) * (n - full * NR) * k);
  }
  at::parallel_for(0, panels, 4, [&](int64_t p0, int64_t p1) {
    alignas(32) float t[NR * MR];
    for (int64_t p = p0; p < p1; ++p) {
      const float* wp = p < full ? w + p * NR * k : tail.data_ptr<float>();
      const float* ahead = p + 1 < full ? w + (p + 1) * NR * k : p + 1 < panels ? tail.data_ptr<float>() : wp;
      const int64_t n0 = p * NR, cols = std::min(NR, n - n0);
      for (int64_t ch = 0; ch < chunks; ++ch) {
        const int64_t m0 = ch * MR, rows = std::min(MR, m - m0);
        if (rows > 8)
          micro<2>(xd + ch * k * MR, wp, k, k, ahead, t);
        else
          micro<1>(xd + ch * k * MR, wp, k, k, ahead, t);
        for (int64_t r = 0; r < rows; ++r) {
          float* y = o + (m0 + r) * n + n0;
          for (int64_t i = 0; i < cols; ++i) y[i] = t[i * MR + r] + (b ? b[n0 + i] : 0.f);
        }
      }
    }
  });
}

}  // namespace kvferry

namespace {

at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(),
              "kvferry::skinny_linear: x must be a contiguous CPU [rows, in]");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.device().is_cpu(),
              "kvferry::skinny_linear: weight must be a contiguous CPU [out, in]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "kvferry::skinny_linear: fp32 only");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(weight.size(1) == k, "kvferry::skinny_linear: x has ", k, " features, weight ", weight.size(1));
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous() &&
                    bias->scalar_type() == at::kFloat && bias->device().is_cpu(),
                "kvferry::skinny_linear: bias must be a contiguous fp32 CPU [out]");
    b = bias->data_ptr<float>();
  }
  at::Tensor out = at::empty({m, n}, x.options());
  kvferry::skinny_gemm(x.data_ptr<float>(), m, k, weight.data_ptr<float>(), n, b, out.data_ptr<float>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvferry, m) { m.def("skinny_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor"); }

TORCH_LIBRARY_IMPL(kvferry, CPU, m) { m.impl("skinny_linear", &skinny_linear); }
