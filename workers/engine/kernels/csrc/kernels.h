// What the CPU kernels share between their sources (built into one library by cpu_kernels.py):
// the decode-step GEMM and the paged decode attention, over raw fp32 buffers, so the fused
// decoder stack (decoder_layers.cpp) calls them without a trip through the dispatcher.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace kvferry {

// An op's optional fp32 bias of `n` outputs, checked (`op` names the op in the error): its data, or
// null when absent.
inline const float* checked_bias(const c10::optional<at::Tensor>& bias, int64_t n, const char* op) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous() && bias->scalar_type() == at::kFloat &&
                  bias->device().is_cpu(),
              "kvferry::", op, ": bias must be a contiguous fp32 CPU [out]");
  return bias->data_ptr<float>();
}

// One product of skinny_gemms: out[m, n] = x[m, k] w[n, k]^T (+ bias[n] when not null).
struct Gemm {
  const float* w;
  int64_t n;
  const float* bias;
  float* out;
};

// Each of `count` products over the same x [m, k], in one parallel region over all their panels.
// Every pointer contiguous, row-major.
void skinny_gemms(const float* x, int64_t m, int64_t k, const Gemm* gemms, int64_t count);

inline void skinny_gemm(const float* x, int64_t m, int64_t k, const float* w, int64_t n, const float* bias,
                        float* out) {
  const Gemm gemm{w, n, bias, out};
  skinny_gemms(x, m, k, &gemm, 1);
}

// One product of skinny_bf16_gemms: out[m, n] = x[m, k] w[n, k]^T (+ bias[n]) over a bf16 weight
// (plain row-major), x rounded to bf16, fp32 sums, the result rounded to bf16 and widened.
struct Bf16Gemm {
  const c10::BFloat16* w;
  int64_t n;
  const float* bias;
  float* out;
};

// Whether skinny_bf16_gemms runs here (built with AVX512-BF16); it raises where it does not.
bool skinny_bf16_runs();
// Each of `count` products over the same x [m, k], in one parallel region (skinny_bf16.cpp).
void skinny_bf16_gemms(const float* x, int64_t m, int64_t k, const Bf16Gemm* gemms, int64_t count);

// out[m, n] = SiLU(x wg^T + bg) * (x wu^T + bu), a gated MLP's first half, in one parallel region
// (biases may be null).
void skinny_gated(const float* x, int64_t m, int64_t k, const float* wg, const float* bg, const float* wu,
                  const float* bu, int64_t n, float* out);

// out[i, Hq, D] = attention of q[i, Hq, D] over the first lens[i] slots of the blocks tables[i, :]
// in k_pool / v_pool ([slots, Hkv, D] each). Nothing is checked here: the ops' wrappers do.
void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const float* k_pool,
                     const float* v_pool, int64_t hkv, const int64_t* tables, int64_t width, const int64_t* lens,
                     int64_t block_size, float scale);
// The same over a bf16 pool (K/V widened to fp32 as they are read; fp32 scores, softmax, sums).
void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const c10::BFloat16* k_pool,
                     const c10::BFloat16* v_pool, int64_t hkv, const int64_t* tables, int64_t width,
                     const int64_t* lens, int64_t block_size, float scale);

// The same over an int8 pool ([slots, Hkv, D + 4] each: a row's D values, then its fp32 scale).
void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const int8_t* k_pool,
                     const int8_t* v_pool, int64_t hkv, const int64_t* tables, int64_t width, const int64_t* lens,
                     int64_t block_size, float scale);
// Whichever of the three `type` (kFloat, kBFloat16, kChar) names.
void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const void* k_pool,
                     const void* v_pool, at::ScalarType type, int64_t hkv, const int64_t* tables, int64_t width,
                     const int64_t* lens, int64_t block_size, float scale);

// The pool's rows (kv_rows.cpp). An int8 pool's row: D int8 values, then the row's fp32 scale.
constexpr int64_t INT8_SCALE_BYTES = 4;
// Elements of one head row in a pool of `type`: D, or D + 4 for int8.
int64_t row_elems(at::ScalarType type, int64_t d);
// One token's K and V ([Hkv, D] fp32 each) into `slot` of one layer's K and V pools: copied,
// rounded to bf16, or quantised with a scale per head (kvstore/pool/int8_rows.py's arithmetic).
void store_kv(char* k_pool, char* v_pool, at::ScalarType type, int64_t slot, const float* k, const float* v,
              int64_t hkv, int64_t d);
// Rows read out of a pool ([..., row] of its type) as [..., D] fp32: widened, or dequantised.
at::Tensor widen_rows(const at::Tensor& rows, int64_t d);

// out[m, Hq, D] = attention of a prefill chunk's m query rows q [m, Hq, D] (consecutive positions
// ending at len - 1) over its context's first len slots through `table` (chunk_attention.cpp).
void chunk_attention(float* out, const float* q, int64_t m, int64_t hq, int64_t d, const void* pool_half_k,
                     const void* pool_half_v, at::ScalarType kv_type, int64_t num_blocks, int64_t hkv,
                     const int64_t* table, int64_t len, int64_t block_size, double scale);

// Raises (TORCH_CHECK) unless every row's length fits its table and its blocks lie in the pool.
void check_tables(const int64_t* tables, int64_t n, int64_t width, const int64_t* lens, int64_t block_size,
                  int64_t num_blocks);

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w, for `rows` rows of `width` (transformers' RMSNorm).
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t width, float eps);

// x[h] = x[h] * cos + rotate_half(x[h]) * sin for each of `heads` heads of row x ([heads, d]).
void rotary(float* x, const float* cos, const float* sin, int64_t heads, int64_t d);

// out[m, n] = x W^T (+ b), the large-batch linears of the fused stack (layer_ops.cpp): ATen's GEMM,
// oneDNN's over the same fp32 weight, and oneDNN's bf16 GEMM over a bf16 weight (plain or reordered).
void aten_linear(const float* x, int64_t m, const at::Tensor& w, const at::Tensor& b, float* out);
void onednn_linear(const float* x, int64_t m, const at::Tensor& w, const at::Tensor& b, float* out);
void onednn_bf16_linear(const float* x, int64_t m, const at::Tensor& w, const at::Tensor& b, float* out);
// int8 weight-only (int8_linear.cpp): out = (x q^T) * s + b, w16 = q widened to bf16 (plain or in
// oneDNN's layout), q int8 [n, k] (read when int8_kernel), s bf16 [n].
void check_int8_linear(const at::Tensor& q, const at::Tensor& s, int64_t out_features, int64_t in_features,
                       bool int8_kernel, int64_t layer, int64_t index);
void int8_linear(const float* x, int64_t m, const at::Tensor& w16, const at::Tensor& q, const at::Tensor& s,
                 const at::Tensor& b, float* out, bool int8_kernel);

}  // namespace kvferry
