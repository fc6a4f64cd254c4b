// kvferry::paged_decode: single-token attention over the paged K/V pool, read in place.
//
// The torch path gathers every decode's context out of the pool (index_select) and then runs
// SDPA on the copy; on CPU both are memory-bound and SDPA's flash kernel does little with one
// query row. This kernel walks each sequence's block table instead: one pass over K for the
// scores, a softmax, one pass over V, with all query heads of a kv head sharing each K/V row it
// loads. Sequences are split across torch's intra-op threads (at::parallel_for). With AVX-512
// (attend_avx512.h) the passes go a tile of 16 slots at a time, every KV head's rows of the tile
// together, each row widened to fp32 once, the 16 scores of a head summed by one transpose-reduce,
// the next tile prefetched; elsewhere (AVX2-only and other CPUs) the portable `attend` below.
//
// Shapes: out, q [n, Hq, D]; pool [2, slots, Hkv, D] (one layer: K then V); tables [n, W] block
// ids; lens [n] context lengths (the new token included). q, out fp32; the pool fp32 or bf16
// (widened as read: the scores, softmax and sums are fp32), or int8 [2, slots, Hkv, D + 4] (each
// row's fp32 scale after its values: the portable loop applies it to the row's dot product and
// softmax weight, the AVX-512 one dequantises the row, value * scale, as int8_rows.dequantize).
// Contiguous.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "attend_avx512.h"
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// A pool row of one head: D elements (fp32, bf16), or D int8 values and the row's fp32 scale.
template <typename KV, int64_t D>
struct Row {
  static constexpr bool QUANTIZED = std::is_same_v<KV, int8_t>;
  static constexpr int64_t SIZE = QUANTIZED ? D + kvferry::INT8_SCALE_BYTES : D;
  static float scale(const KV* row) {
    if constexpr (QUANTIZED) {
      float s;
      std::memcpy(&s, row + D, sizeof s);
      return s;
    } else {
      return 1.f;
    }
  }
};

// The portable path (no AVX-512). One row widened to fp32 into `buf` (a narrower pool's, once for the g query heads that share it),
// or read where it lies (fp32: the same products in the same order).
template <typename KV, int64_t D>
const float* widened(const KV* row, float* buf) {
  if constexpr (std::is_same_v<KV, float>) {
    return row;
  } else {
    for (int64_t x = 0; x < D; ++x) buf[x] = static_cast<float>(row[x]);
    return buf;
  }
}

template <typename KV, int64_t D>
void attend(const float* q, const KV* kp, const KV* vp, const int64_t* slots, int64_t len,
            int64_t hq, int64_t hkv, float scale, float* score, float* acc, float* out) {
  using R = Row<KV, D>;
  const int64_t g = hq / hkv;
  float buf[D];
  for (int64_t t = 0; t < len; ++t) {  // scores: score[h * len + t] = q_h . k_t * scale
    const KV* krow = kp + slots[t] * hkv * R::SIZE;
    for (int64_t j = 0; j < hkv; ++j) {  // kv head j serves query heads [j * g, (j + 1) * g)
      const float* k = widened<KV, D>(krow + j * R::SIZE, buf);
      const float ks = R::scale(krow + j * R::SIZE);
      for (int64_t h = j * g; h < (j + 1) * g; ++h) {
        const float* qh = q + h * D;
        float a = 0.f;
#pragma omp simd reduction(+ : a)
        for (int64_t x = 0; x < D; ++x) a += qh[x] * k[x];
        score[h * len + t] = a * scale * ks;
      }
    }
  }
  std::vector<float> inv(hq);
  for (int64_t h = 0; h < hq; ++h) {
    float* row = score + h * len;
    const float m = *std::max_element(row, row + len);
    float sum = 0.f;
    for (int64_t t = 0; t < len; ++t) {
      row[t] = std::exp(row[t] - m);
      sum += row[t];
    }
    inv[h] = 1.f / sum;
  }
  std::fill(acc, acc + hq * D, 0.f);
  for (int64_t t = 0; t < len; ++t) {  // acc_h += p_ht * v_t
    const KV* vrow = vp + slots[t] * hkv * R::SIZE;
    for (int64_t j = 0; j < hkv; ++j) {
      const float* v = widened<KV, D>(vrow + j * R::SIZE, buf);
      const float vs = R::scale(vrow + j * R::SIZE);
      for (int64_t h = j * g; h < (j + 1) * g; ++h) {
        const float p = score[h * len + t] * vs;
        float* a = acc + h * D;
#pragma omp simd
        for (int64_t x = 0; x < D; ++x) a[x] += p * v[x];
      }
    }
  }
  for (int64_t h = 0; h < hq; ++h)
    for (int64_t x = 0; x < D; ++x) out[h * D + x] = acc[h * D + x] * inv[h];
}

template <typename KV, int64_t D>
void run(float* op, const float* qp, int64_t n, int64_t hq, const KV* kp, const KV* vp, int64_t hkv,
         const int64_t* tp, int64_t width, const int64_t* lp, int64_t block_size, float scale) {
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> score, acc(hq * D);
    std::vector<int64_t> slots;
    for (int64_t i = begin; i < end; ++i) {
      // Rows come longest context first; taking them from both ends (0, n-1, 1, n-2, ...) gives
      // each thread's contiguous share a mix of long and short contexts instead of all the long.
      const int64_t s = i % 2 == 0 ? i / 2 : n - 1 - i / 2;
      const int64_t len = lp[s];
      score.resize(hq * ((len + 15) / 16 * 16 + 1));  // avx512::attend's tiles of 16, and Hq inverses
      slots.resize(len);
      for (int64_t t = 0; t < len; ++t) slots[t] = tp[s * width + t / block_size] * block_size + t % block_size;
#if defined(__AVX512F__)
      kvferry::avx512::attend<KV, D>(qp + s * hq * D, kp, vp, slots.data(), len, hq, hkv, Row<KV, D>::SIZE, scale,
                                     score.data(), op + s * hq * D);
#else
      attend<KV, D>(qp + s * hq * D, kp, vp, slots.data(), len, hq, hkv, scale, score.data(), acc.data(),
                    op + s * hq * D);
#endif
    }
  });
}

template <typename KV>
void dispatch(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const KV* k_pool, const KV* v_pool,
              int64_t hkv, const int64_t* tables, int64_t width, const int64_t* lens, int64_t block_size,
              float scale) {
  switch (d) {
    case 64: run<KV, 64>(out, q, n, hq, k_pool, v_pool, hkv, tables, width, lens, block_size, scale); break;
    case 128: run<KV, 128>(out, q, n, hq, k_pool, v_pool, hkv, tables, width, lens, block_size, scale); break;
    case 32: run<KV, 32>(out, q, n, hq, k_pool, v_pool, hkv, tables, width, lens, block_size, scale); break;
    case 16: run<KV, 16>(out, q, n, hq, k_pool, v_pool, hkv, tables, width, lens, block_size, scale); break;
    case 256: run<KV, 256>(out, q, n, hq, k_pool, v_pool, hkv, tables, width, lens, block_size, scale); break;
    default: TORCH_CHECK(false, "paged_decode: head_dim ", d, " not built (16, 32, 64, 128, 256)");
  }
}

}  // namespace

namespace kvferry {

void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const float* k_pool,
                     const float* v_pool, int64_t hkv, const int64_t* tables, int64_t width,
                     const int64_t* lens, int64_t block_size, float scale) {
  dispatch(out, q, n, hq, d, k_pool, v_pool, hkv, tables, width, lens, block_size, scale);
}

void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const c10::BFloat16* k_pool,
                     const c10::BFloat16* v_pool, int64_t hkv, const int64_t* tables, int64_t width,
                     const int64_t* lens, int64_t block_size, float scale) {
  dispatch(out, q, n, hq, d, k_pool, v_pool, hkv, tables, width, lens, block_size, scale);
}

void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const int8_t* k_pool,
                     const int8_t* v_pool, int64_t hkv, const int64_t* tables, int64_t width, const int64_t* lens,
                     int64_t block_size, float scale) {
  dispatch(out, q, n, hq, d, k_pool, v_pool, hkv, tables, width, lens, block_size, scale);
}

void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const void* k_pool,
                     const void* v_pool, at::ScalarType type, int64_t hkv, const int64_t* tables, int64_t width,
                     const int64_t* lens, int64_t block_size, float scale) {
  switch (type) {
    case at::kFloat:
      dispatch(out, q, n, hq, d, static_cast<const float*>(k_pool), static_cast<const float*>(v_pool), hkv, tables,
               width, lens, block_size, scale);
      break;
    case at::kBFloat16:
      dispatch(out, q, n, hq, d, static_cast<const c10::BFloat16*>(k_pool), static_cast<const c10::BFloat16*>(v_pool),
               hkv, tables, width, lens, block_size, scale);
      break;
    case at::kChar:
      dispatch(out, q, n, hq, d, static_cast<const int8_t*>(k_pool), static_cast<const int8_t*>(v_pool), hkv, tables,
               width, lens, block_size, scale);
      break;
    default: TORCH_CHECK(false, "paged_decode: a pool of fp32, bf16 or int8 K/V");
  }
}

void check_tables(const int64_t* tp, int64_t n, int64_t width, const int64_t* lp, int64_t block_size,
                  int64_t num_blocks) {
  for (int64_t s = 0; s < n; ++s) {  // bounds: a bad table must raise, never read outside the pool
    TORCH_CHECK(lp[s] >= 1 && lp[s] <= width * block_size, "context length out of its table");
    for (int64_t b = 0; b < (lp[s] - 1) / block_size + 1; ++b)
      TORCH_CHECK(tp[s * width + b] >= 0 && tp[s * width + b] < num_blocks, "block id outside the pool");
  }
}

}  // namespace kvferry

namespace {

void paged_decode(at::Tensor out, const at::Tensor& q, const at::Tensor& pool, const at::Tensor& tables,
                  const at::Tensor& lens, int64_t block_size, double scale) {
  TORCH_CHECK(q.dim() == 3 && pool.dim() == 4 && pool.size(0) == 2, "q [n, Hq, D], pool [2, slots, Hkv, row]");
  const at::ScalarType type = pool.scalar_type();
  TORCH_CHECK(q.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat &&
                  (type == at::kFloat || type == at::kBFloat16 || type == at::kChar),
              "paged_decode: fp32 q and out, an fp32, bf16 or int8 pool");
  TORCH_CHECK(tables.scalar_type() == at::kLong && lens.scalar_type() == at::kLong, "int64 tables and lens");
  TORCH_CHECK(q.is_contiguous() && pool.is_contiguous() && out.is_contiguous() && tables.is_contiguous() &&
                  lens.is_contiguous(), "contiguous tensors");
  TORCH_CHECK(out.sizes() == q.sizes(), "out must be shaped like q");
  const int64_t n = q.size(0), d = q.size(2), hkv = pool.size(2);
  TORCH_CHECK(pool.size(3) == kvferry::row_elems(type, d) && hkv > 0 && q.size(1) % hkv == 0,
              "Hq must be a multiple of Hkv, the pool's rows of D (int8: D + 4)");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == n && lens.numel() == n, "one table and length per row");
  TORCH_CHECK(block_size > 0 && pool.size(1) % block_size == 0, "slots must be whole blocks");
  const int64_t width = tables.size(1), slots = pool.size(1);
  kvferry::check_tables(tables.data_ptr<int64_t>(), n, width, lens.data_ptr<int64_t>(), block_size,
                        slots / block_size);
  const char* kp = static_cast<const char*>(pool.data_ptr());
  const char* vp = kp + slots * hkv * pool.size(3) * pool.element_size();
  kvferry::paged_attention(out.data_ptr<float>(), q.data_ptr<float>(), n, q.size(1), d, kp, vp, type, hkv,
                           tables.data_ptr<int64_t>(), width, lens.data_ptr<int64_t>(), block_size,
                           static_cast<float>(scale));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvferry, m) {
  m.def("paged_decode(Tensor(a!) out, Tensor q, Tensor pool, Tensor tables, Tensor lens, int block_size, "
        "float scale) -> ()");
}

TORCH_LIBRARY_IMPL(kvferry, CPU, m) { m.impl("paged_decode", &paged_decode); }
