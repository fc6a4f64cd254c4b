// What the CPU kernels share between their sources (built into one library by cpu_kernels.py):
// the decode-step GEMM and the paged decode attention, over raw fp32 buffers, so the fused
// decoder stack (decode_layers.cpp) calls them without a trip through the dispatcher.
#pragma once

#include <cstdint>

namespace kvferry {

// out[m, n] = x[m, k] W[n, k]^T (+ bias[n] when not null). Every pointer contiguous, row-major.
void skinny_gemm(const float* x, int64_t m, int64_t k, const float* w, int64_t n, const float* bias,
                 float* out);

// out[i, Hq, D] = attention of q[i, Hq, D] over the first lens[i] slots of the blocks tables[i, :]
// in k_pool / v_pool ([slots, Hkv, D] each). Nothing is checked here: the ops' wrappers do.
void paged_attention(float* out, const float* q, int64_t n, int64_t hq, int64_t d, const float* k_pool,
                     const float* v_pool, int64_t hkv, const int64_t* tables, int64_t width,
                     const int64_t* lens, int64_t block_size, float scale);

// Raises (TORCH_CHECK) unless every row's length fits its table and its blocks lie in the pool.
void check_tables(const int64_t* tables, int64_t n, int64_t width, const int64_t* lens, int64_t block_size,
                  int64_t num_blocks);

}  // namespace kvferry
