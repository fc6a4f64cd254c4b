// kvferry::skinny_linear: y = x W^T + b for the few rows of a decode step, over the model's own
// [out, in] weight.
//
// A decode step multiplies a handful of rows (one per sequence) by every weight of the model, so
// on CPU it is bound by streaming the weights from memory; a general GEMM blocks for reuse that
// a handful of rows cannot give (oneDNN and MKL read SmolLM2's weights well below what the memory
// gives at 16 rows: docs/benchmarks.md). This one reads each weight once per 16 rows: a panel of 6
// output features (6 adjacent rows of W, one contiguous run of memory) against 16 rows of x held
// transposed, one weight broadcast at a time into 12 accumulators, the next panel prefetched as one
// linear stream. Panels are split across torch's intra-op threads (at::parallel_for). Up to a row
// count that depends on the CPU (measured at start-up: crossover.py) it keeps ahead of oneDNN;
// larger batches (prefill chunks) belong to oneDNN (packed_linear.py).
//
// Written with GCC vector extensions rather than intrinsics: -march=native turns them into AVX2
// FMAs on x86 and NEON on aarch64. fp32 only.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace {

typedef float vec8 __attribute__((vector_size(32)));
constexpr int64_t NR = 6;   // output features per panel
constexpr int64_t MR = 16;  // rows of x per chunk (two vec8)

// t[i * MR + r] = sum_c w[i * ldw + c] * xt[c * MR + r] for i < NR and J * 8 rows r; `ahead` is
// the next panel, prefetched while this one is multiplied.
template <int J>
inline void micro(const float* __restrict xt, const float* __restrict w, int64_t ldw, int64_t k, const float* ahead,
                  float* __restrict t) {
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

// x [m, k] transposed into 16-row chunks [chunks, k, MR], zero past m. Allocations are 64-byte
// aligned and each chunk is k * 64 bytes, so every vec8 load is aligned.
at::Tensor transposed(const float* xs, int64_t m, int64_t k) {
  const int64_t chunks = (m + MR - 1) / MR;
  at::Tensor xt = at::empty({chunks, k, MR}, at::TensorOptions().dtype(at::kFloat));
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
  return xt;
}

// The NR-row panels of a weight [n, k]: the full ones where they lie, the last n % NR rows in a
// zero-padded copy of their own.
struct Panels {
  const float* w;
  int64_t k, full, count;
  at::Tensor tail;

  Panels(const float* weight, int64_t n, int64_t cols) : w(weight), k(cols), full(n / NR), count((n + NR - 1) / NR) {
    if (count > full) {
      tail = at::zeros({NR, k}, at::TensorOptions().dtype(at::kFloat));
      if (k > 0) std::memcpy(tail.data_ptr<float>(), w + full * NR * k, sizeof(float) * (n - full * NR) * k);
    }
  }
  const float* operator[](int64_t p) const { return p < full ? w + p * NR * k : tail.data_ptr<float>(); }
};

// For each 16-row chunk of x (xd, transposed): t = the products of panel wp with its rows, then
// emit(m0, rows, t) with t[i * MR + r] for output feature i of the panel and row m0 + r.
template <typename Emit>
inline void panel_product(const float* xd, int64_t m, int64_t k, const float* wp, const float* ahead, Emit&& emit) {
  alignas(32) float t[NR * MR];
  for (int64_t m0 = 0; m0 < m; m0 += MR) {
    const int64_t rows = std::min(MR, m - m0);
    const float* xc = xd + (m0 / MR) * k * MR;
    if (rows > 8)
      micro<2>(xc, wp, k, k, ahead, t);
    else
      micro<1>(xc, wp, k, k, ahead, t);
    emit(m0, rows, t);
  }
}

}  // namespace

namespace kvferry {

void skinny_gemms(const float* xs, int64_t m, int64_t k, const Gemm* gemms, int64_t count) {
  if (m == 0) return;
  at::Tensor xt = transposed(xs, m, k);
  const float* xd = xt.data_ptr<float>();
  std::vector<Panels> panels;
  std::vector<int64_t> first(count + 1, 0);  // gemm j's panels are [first[j], first[j + 1])
  panels.reserve(count);
  for (int64_t j = 0; j < count; ++j) {
    panels.emplace_back(gemms[j].w, gemms[j].n, k);
    first[j + 1] = first[j] + panels[j].count;
  }
  // One parallel region over every panel of every weight: a layer's q, k and v cost one fork and
  // join of the thread team, not three.
  at::parallel_for(0, first[count], 4, [&](int64_t p0, int64_t p1) {
    int64_t j = 0;
    for (int64_t g = p0; g < p1; ++g) {
      while (g >= first[j + 1]) ++j;
      const Gemm& gemm = gemms[j];
      const int64_t p = g - first[j], n0 = p * NR, cols = std::min(NR, gemm.n - n0);
      const float* ahead = panels[j][p];  // the next panel, of this weight or the next with any
      if (p + 1 < panels[j].count) {
        ahead = panels[j][p + 1];
      } else if (g + 1 < first[count]) {
        int64_t next = j + 1;
        while (first[next + 1] == first[next]) ++next;
        ahead = panels[next][0];
      }
      panel_product(xd, m, k, panels[j][p], ahead, [&](int64_t m0, int64_t rows, const float* t) {
        for (int64_t r = 0; r < rows; ++r) {
          float* y = gemm.out + (m0 + r) * gemm.n + n0;
          for (int64_t i = 0; i < cols; ++i) y[i] = t[i * MR + r] + (gemm.bias ? gemm.bias[n0 + i] : 0.f);
        }
      });
    }
  });
}

void skinny_gated(const float* xs, int64_t m, int64_t k, const float* wg, const float* bg, const float* wu,
                  const float* bu, int64_t n, float* out) {
  if (m == 0 || n == 0) return;
  at::Tensor xt = transposed(xs, m, k);
  const float* xd = xt.data_ptr<float>();
  const Panels gate(wg, n, k), up(wu, n, k);
  at::parallel_for(0, gate.count, 4, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * NR, cols = std::min(NR, n - n0);
      panel_product(xd, m, k, gate[p], up[p], [&](int64_t m0, int64_t rows, const float* t) {
        for (int64_t r = 0; r < rows; ++r) {
          float* y = out + (m0 + r) * n + n0;
          for (int64_t i = 0; i < cols; ++i) y[i] = t[i * MR + r] + (bg ? bg[n0 + i] : 0.f);
        }
      });
      const float* ahead = p + 1 < gate.count ? gate[p + 1] : up[p];
      panel_product(xd, m, k, up[p], ahead, [&](int64_t m0, int64_t rows, const float* t) {
        for (int64_t r = 0; r < rows; ++r) {
          float* y = out + (m0 + r) * n + n0;
          for (int64_t i = 0; i < cols; ++i) {
            const float g = y[i];
            y[i] = g / (1.f + std::exp(-g)) * (t[i * MR + r] + (bu ? bu[n0 + i] : 0.f));  // SiLU(gate) * up
          }
        }
      });
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
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "kvferry::skinny_linear: fp32 only");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(weight.size(1) == k, "kvferry::skinny_linear: x has ", k, " features, weight ", weight.size(1));
  const float* b = kvferry::checked_bias(bias, n, "skinny_linear");
  at::Tensor out = at::empty({m, n}, x.options());
  kvferry::skinny_gemm(x.data_ptr<float>(), m, k, weight.data_ptr<float>(), n, b, out.data_ptr<float>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvferry, m) { m.def("skinny_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor"); }

TORCH_LIBRARY_IMPL(kvferry, CPU, m) { m.impl("skinny_linear", &skinny_linear); }
