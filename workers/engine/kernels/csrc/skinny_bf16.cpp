// kvferry::skinny_bf16_linear: y = x W^T + b for the few rows of a decode step over a bf16 weight
// [out, in] in its plain row-major layout, on AVX512-BF16 (vdpbf16ps: pairs of bf16 products
// summed into fp32 lanes).
//
// A decode step reads every weight of the model for a handful of rows, so it is bound by streaming
// the weights from memory; oneDNN's bf16 GEMM, blocked for the reuse of large batches, reads
// SmolLM2's weights well below what the memory gives at a few rows (docs/benchmarks.md). Here a
// block of output features (16 for one row of x, 8 for two, else 4) is multiplied against the rows
// of x (1, 2, or 4 at a time: the block's weight rows come from memory once, then from L1 for each
// further 4 rows), 32 columns a step, into 16 accumulators of 16 lanes, the weights of a block a
// few blocks ahead prefetched meanwhile; one transpose-reduce (attend_avx512.h) then sums each
// accumulator's lanes, 16 results in one vector. Blocks are split across torch's intra-op threads,
// every block of a layer's q, k and v (or gate and up) in one parallel region.
//
// As oneDNN's bf16 linear computes: x rounded to bf16, fp32 accumulation, + bias, the result
// rounded to bf16 and widened back to fp32; only the summation order differs, and a row's outputs
// are the same whatever other rows share the call. Up to a row count measured at start-up against
// oneDNN on the CPU at hand (bf16_linear.py); larger batches (prefill chunks) stay oneDNN's.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "attend_avx512.h"
#define KVFERRY_BF16_DOT 1
#endif

namespace {

constexpr int64_t KC = 32;             // bf16 columns a vector
constexpr int64_t PREFETCH_BLOCKS = 4;  // how far ahead the weights are prefetched (kvferry bench gemm)

#ifdef KVFERRY_BF16_DOT

inline __m512bh bh(__m512i v) { return (__m512bh)v; }

// t[f * ROWS + r] = sum_c w[f][c] * x[r][c] + bias[f * ROWS + r], rounded to bf16, for f < F,
// r < ROWS: 16 accumulators, F * ROWS == 16 (x rows ldx apart, padded with zeros to a multiple of
// KC columns; w rows k apart, a masked load for the last partial vector).
template <int F, int ROWS>
inline void block(const c10::BFloat16* const* w, int64_t k, const c10::BFloat16* x, int64_t ldx, const char* ahead,
                  const float* bias, float* t) {
  static_assert(F * ROWS == 16, "16 accumulators");
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const int64_t full = k / KC * KC;
  auto step = [&](int64_t c, __mmask32 mask) {
    __m512i xv[ROWS];
    for (int r = 0; r < ROWS; ++r) xv[r] = _mm512_loadu_si512(x + r * ldx + c);
    if (ahead != nullptr)  // F rows PREFETCH_BLOCKS ahead, F lines a step: as many as this block reads
      for (int f = 0; f < F; ++f) _mm_prefetch(ahead + 2 * (f * k + c), _MM_HINT_T0);
    for (int f = 0; f < F; ++f) {
      const __m512i wv = _mm512_maskz_loadu_epi16(mask, w[f] + c);
      for (int r = 0; r < ROWS; ++r) acc[f * ROWS + r] = _mm512_dpbf16_ps(acc[f * ROWS + r], bh(wv), bh(xv[r]));
    }
  };
  for (int64_t c = 0; c < full; c += KC) step(c, ~__mmask32(0));
  if (full < k) step(full, (__mmask32(1) << (k - full)) - 1);
  const __m512 sums = _mm512_add_ps(kvferry::avx512::sum16(acc), _mm512_loadu_ps(bias));
  const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(sums);  // to nearest even, as c10::BFloat16
  _mm512_storeu_si512(t, _mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));  // widened back, exact
}

#endif

// x [m, k] fp32 rounded to bf16 rows of ldx (k rounded up to KC) columns, zero past k and past m up
// to a multiple of 4 rows.
std::vector<c10::BFloat16> narrowed(const float* x, int64_t m, int64_t k, int64_t ldx) {
  std::vector<c10::BFloat16> xb((m + 3) / 4 * 4 * ldx, c10::BFloat16(0.f));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) xb[r * ldx + c] = c10::BFloat16(x[r * k + c]);
  return xb;
}

}  // namespace

namespace kvferry {

bool skinny_bf16_runs() {
#ifdef KVFERRY_BF16_DOT
  return true;
#else
  return false;
#endif
}

void skinny_bf16_gemms(const float* xs, int64_t m, int64_t k, const Bf16Gemm* gemms, int64_t count) {
  TORCH_CHECK(skinny_bf16_runs(), "kvferry::skinny_bf16_linear: this CPU (or build) has no AVX512-BF16");
#ifdef KVFERRY_BF16_DOT
  if (m == 0) return;
  const int64_t ldx = (k + KC - 1) / KC * KC;
  const std::vector<c10::BFloat16> xb = narrowed(xs, m, k, ldx);
  std::vector<int64_t> first(count + 1, 0);  // gemm j's blocks are [first[j], first[j + 1])
  // One parallel region over every block of every weight: a layer's q, k and v cost one fork and
  // join of the thread team, not three.
  // Features a block: 16 for one row (16 independent sums), 8 for two, 4 for more (4 rows a pass).
  const int64_t nb = m == 1 ? 16 : m == 2 ? 8 : 4, mb = 16 / nb;
  for (int64_t j = 0; j < count; ++j) first[j + 1] = first[j] + (gemms[j].n + nb - 1) / nb;
  // The weight rows PREFETCH_BLOCKS blocks after block [n0, n0 + nb) of gemm j, or the next gemm's
  // first rows where this one ends sooner.
  auto ahead = [&](int64_t j, int64_t n0) -> const char* {
    if (n0 + (PREFETCH_BLOCKS + 1) * nb <= gemms[j].n)
      return reinterpret_cast<const char*>(gemms[j].w + (n0 + PREFETCH_BLOCKS * nb) * k);
    return j + 1 < count ? reinterpret_cast<const char*>(gemms[j + 1].w) : nullptr;
  };
  at::parallel_for(0, first[count], 1, [&](int64_t b0, int64_t b1) {
    int64_t j = 0;
    alignas(64) float t[16], bias[16];
    const c10::BFloat16* w[16];
    for (int64_t b = b0; b < b1; ++b) {
      while (b >= first[j + 1]) ++j;
      const Bf16Gemm& g = gemms[j];
      const int64_t n0 = (b - first[j]) * nb, cols = std::min(nb, g.n - n0);
      for (int64_t f = 0; f < nb; ++f) w[f] = g.w + (n0 + std::min(f, cols - 1)) * k;  // a short block repeats its last row
      for (int64_t a = 0; a < 16; ++a) bias[a] = g.bias ? g.bias[n0 + std::min(a / mb, cols - 1)] : 0.f;
      for (int64_t m0 = 0; m0 < m; m0 += mb) {
        const int64_t rows = std::min(mb, m - m0);
        const c10::BFloat16* x = xb.data() + m0 * ldx;
        // Every pass prefetches (a pass is short, and memory must stay busy through all of them).
        const char* next = ahead(j, n0);
        if (nb == 16)
          block<16, 1>(w, k, x, ldx, next, bias, t);
        else if (nb == 8)
          block<8, 2>(w, k, x, ldx, next, bias, t);
        else
          block<4, 4>(w, k, x, ldx, next, bias, t);  // rows past m are zeros
        for (int64_t r = 0; r < rows; ++r) {
          float* y = g.out + (m0 + r) * g.n + n0;
          for (int64_t f = 0; f < cols; ++f) y[f] = t[f * mb + r];
        }
      }
    }
  });
#else
  (void)xs, (void)m, (void)k, (void)gemms, (void)count;
#endif
}

}  // namespace kvferry

namespace {

at::Tensor skinny_bf16_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu() && x.scalar_type() == at::kFloat,
              "kvferry::skinny_bf16_linear: x must be a contiguous fp32 CPU [rows, in]");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.device().is_cpu() &&
                  weight.scalar_type() == at::kBFloat16,
              "kvferry::skinny_bf16_linear: weight must be a contiguous bf16 CPU [out, in]");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(weight.size(1) == k, "kvferry::skinny_bf16_linear: x has ", k, " features, weight ", weight.size(1));
  const float* b = kvferry::checked_bias(bias, n, "skinny_bf16_linear");
  at::Tensor out = at::empty({m, n}, x.options());
  const kvferry::Bf16Gemm gemm{weight.data_ptr<c10::BFloat16>(), n, b, out.data_ptr<float>()};
  kvferry::skinny_bf16_gemms(x.data_ptr<float>(), m, k, &gemm, 1);
  return out;
}

bool skinny_bf16_available() { return kvferry::skinny_bf16_runs(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvferry, m) {
  m.def("skinny_bf16_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("skinny_bf16_runs() -> bool", &skinny_bf16_available);
}

TORCH_LIBRARY_IMPL(kvferry, CPU, m) { m.impl("skinny_bf16_linear", &skinny_bf16_linear); }
