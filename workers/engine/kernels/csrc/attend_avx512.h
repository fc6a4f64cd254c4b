// One sequence's decode attention over the paged pool with AVX-512 (paged_decode.cpp's `attend` on
// CPUs that have it; the portable loop there elsewhere).
//
// The context is walked in tiles of 16 tokens (their slots' rows, all KV heads: contiguous within
// a block, any block across a boundary; the next tile's asked for ahead). Each row of a tile is read once and, for a
// narrower pool, widened to fp32 once into a 16-row scratch tile in L1 (bf16: its 16 bits shifted
// into the high half, exact; int8: value * the row's scale, as int8_rows.dequantize), then shared
// by the g query heads of that KV head. Scores: each (token, head) dot product accumulates its D/16
// products in one vector, and the 16 tokens' vectors are summed by one transpose-reduce (no
// horizontal sum per token), then a vector exp (Cephes' polynomial, 2^n by scalef) for the softmax.
// Values: p * v accumulated in registers across the tile, D/16 independent chains. So a bf16 or
// int8 pool is read as its fp32 widening would be, with the same sums in the same order.
#pragma once

#if defined(__AVX512F__)

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kvferry::avx512 {

constexpr int64_t TILE = 16;  // tokens per tile: one vector of scores

// e^x, lane-wise, for x <= 0 (a score less the row's max): Cephes' expf, ~1 ulp.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));  // below e^-104 fp32 is 0 (scalef underflows there)
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // x - n ln2, in two parts
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// Lane t of the result = the sum of v[t]'s 16 lanes: halves, quarters, pairs, lanes of pairs of
// vectors added (15 adds for 16 sums), then one permute into token order.
inline __m512 sum16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // 128-bit quarters 0, 1: token 2i; 2, 3: token 2i + 1
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // quarter k: token 4i + k
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // quarter k, lanes 0, 2: token 8i + k; lanes 1, 3: token 8i + 4 + k
    c[i] = _mm512_add_ps(_mm512_unpacklo_ps(b[2 * i], b[2 * i + 1]), _mm512_unpackhi_ps(b[2 * i], b[2 * i + 1]));
  // quarter k, lanes 0..3: tokens k, 8 + k, 4 + k, 12 + k
  const __m512 s = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15), s);
}

// One head's row of the pool as D fp32 values: an fp32 pool's where it lies, else widened into dst.
template <typename KV, int64_t D>
inline const float* as_fp32(const KV* src, float* dst) {
  if constexpr (std::is_same_v<KV, float>) {
    return src;
  } else if constexpr (std::is_same_v<KV, c10::BFloat16>) {
    for (int64_t c = 0; c < D; c += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c));
      _mm512_store_ps(dst + c, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
    return dst;
  } else {  // int8: D values, then the row's fp32 scale
    float s;
    std::memcpy(&s, src + D, sizeof s);
    const __m512 sv = _mm512_set1_ps(s);
    for (int64_t c = 0; c < D; c += 16) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
      _mm512_store_ps(dst + c, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), sv));
    }
    return dst;
  }
}

// Asks for the cache lines of `n` slots' rows (`elems` each: all KV heads), the next tile's, so
// that they arrive while this one is worked (the slots of a tile lie in one or two blocks).
template <typename KV>
inline void prefetch(const KV* pool, const int64_t* slots, int64_t n, int64_t elems) {
  const int64_t bytes = elems * static_cast<int64_t>(sizeof(KV));
  for (int64_t t = 0; t < n; ++t) {
    const char* p = reinterpret_cast<const char*>(pool + slots[t] * elems);
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
    _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
  }
}

// out [Hq, D] = attention of q [Hq, D] over the `len` slots `slots` of the pools (rows of `row`
// elements, Hkv a slot). score: Hq * (len rounded up to 16) + Hq floats of scratch.
template <typename KV, int64_t D>
void attend(const float* q, const KV* kp, const KV* vp, const int64_t* slots, int64_t len, int64_t hq, int64_t hkv,
            int64_t row, float scale, float* score, float* out) {
  constexpr int64_t C = D / 16;
  static_assert(D % 16 == 0, "head_dim a multiple of 16");
  alignas(64) static const float zero[D] = {};
  alignas(64) float buf[TILE * D];
  const float* rows[TILE];
  const int64_t g = hq / hkv, padded = (len + TILE - 1) / TILE * TILE;
  const __m512 sv = _mm512_set1_ps(scale);
  for (int64_t t0 = 0; t0 < len; t0 += TILE) {  // scores: score[h * padded + t] = q_h . k_t * scale
    const int64_t nt = std::min(TILE, len - t0);
    if (t0 + TILE < len) prefetch(kp, slots + t0 + TILE, std::min(TILE, len - t0 - TILE), hkv * row);
    for (int64_t j = 0; j < hkv; ++j) {  // kv head j serves query heads [j * g, (j + 1) * g)
      for (int64_t t = 0; t < TILE; ++t)
        rows[t] = t < nt ? as_fp32<KV, D>(kp + (slots[t0 + t] * hkv + j) * row, buf + t * D) : zero;
      for (int64_t h = j * g; h < (j + 1) * g; ++h) {
        const float* qh = q + h * D;
        __m512 acc[TILE];
        for (int64_t t = 0; t < TILE; ++t) {
          __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qh), _mm512_loadu_ps(rows[t]));
          for (int64_t c = 1; c < C; ++c)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * c), _mm512_loadu_ps(rows[t] + 16 * c), a);
          acc[t] = a;
        }
        _mm512_storeu_ps(score + h * padded + t0, _mm512_mul_ps(sum16(acc), sv));
      }
    }
  }
  if (len > 0) prefetch(vp, slots, std::min(TILE, len), hkv * row);
  for (int64_t h = 0; h < hq; ++h) {  // softmax: p = e^(s - max), the sum's inverse applied at the end
    float* s = score + h * padded;
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t t0 = 0; t0 < len; t0 += TILE) {
      const __mmask16 valid = len - t0 >= TILE ? 0xFFFF : (1u << (len - t0)) - 1;
      m = _mm512_mask_max_ps(m, valid, m, _mm512_loadu_ps(s + t0));
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < len; t0 += TILE) {
      const __mmask16 valid = len - t0 >= TILE ? 0xFFFF : (1u << (len - t0)) - 1;
      const __m512 e = _mm512_maskz_mov_ps(valid, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t0), mx)));
      _mm512_storeu_ps(s + t0, e);
      sum = _mm512_add_ps(sum, e);
    }
    std::fill(out + h * D, out + (h + 1) * D, 0.f);
    score[hq * padded + h] = 1.f / _mm512_reduce_add_ps(sum);  // kept past the score rows
  }
  for (int64_t t0 = 0; t0 < len; t0 += TILE) {  // out_h += p_ht * v_t
    const int64_t nt = std::min(TILE, len - t0);
    if (t0 + TILE < len) prefetch(vp, slots + t0 + TILE, std::min(TILE, len - t0 - TILE), hkv * row);
    for (int64_t j = 0; j < hkv; ++j) {
      for (int64_t t = 0; t < nt; ++t) rows[t] = as_fp32<KV, D>(vp + (slots[t0 + t] * hkv + j) * row, buf + t * D);
      for (int64_t h = j * g; h < (j + 1) * g; ++h) {
        float* o = out + h * D;
        const float* p = score + h * padded + t0;
        __m512 a[C];
        for (int64_t c = 0; c < C; ++c) a[c] = _mm512_loadu_ps(o + 16 * c);
        for (int64_t t = 0; t < nt; ++t) {
          const __m512 pt = _mm512_set1_ps(p[t]);
          for (int64_t c = 0; c < C; ++c) a[c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(rows[t] + 16 * c), a[c]);
        }
        for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(o + 16 * c, a[c]);
      }
    }
  }
  for (int64_t h = 0; h < hq; ++h) {
    const __m512 inv = _mm512_set1_ps(score[hq * padded + h]);
    float* o = out + h * D;
    for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o + 16 * c), inv));
  }
}

}  // namespace kvferry::avx512

#endif  // __AVX512F__
