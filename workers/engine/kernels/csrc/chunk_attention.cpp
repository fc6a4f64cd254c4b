// kvferry::decoder_layers' attention of a prefill chunk: the chunk's query rows over its context
// in the pool, in one SDPA call.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <cstdint>

#include "kernels.h"

namespace kvferry {

// out[m, Hq, D] = attention of a prefill chunk's m query rows q [m, Hq, D] (consecutive positions
// ending at len - 1) over its context's first len slots through `table`, in one SDPA call over the
// context gathered in whole blocks (bottom-right causal): its rows share every key they load.
void chunk_attention(float* out, const float* q, int64_t m, int64_t hq, int64_t d, const void* pool_half_k,
                     const void* pool_half_v, at::ScalarType kv_type, int64_t num_blocks, int64_t hkv,
                     const int64_t* table, int64_t len, int64_t block_size, double scale) {
  const int64_t row = row_elems(kv_type, d);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t nb = (len - 1) / block_size + 1, start = len - m;
  at::Tensor blocks = at::from_blob(const_cast<int64_t*>(table), {nb}, at::TensorOptions().dtype(at::kLong));
  // A context in consecutive pool blocks (a sequence loaded or computed into a fresh run of the
  // free queue, the usual case) is read in place; any other is gathered into a copy first.
  bool consecutive = table[0] >= 0;  // narrow would wrap a negative start; index_select refuses it
  for (int64_t i = 1; i < nb && consecutive; ++i) consecutive = table[i] == table[0] + i;
  auto gather = [&](const void* half) {  // [1, Hkv, len, D] fp32 (a bf16 or int8 pool's context widened)
    at::Tensor by_block = at::from_blob(const_cast<void*>(half), {num_blocks, block_size * hkv * row},
                                        at::TensorOptions().dtype(kv_type));
    at::Tensor rows = (consecutive ? by_block.narrow(0, table[0], nb) : by_block.index_select(0, blocks))
                          .view({nb * block_size, hkv, row})
                          .narrow(0, 0, len);
    return widen_rows(rows, d).permute({1, 0, 2}).unsqueeze(0);
  };
  at::Tensor mask = at::empty({m, len}, at::TensorOptions().dtype(at::kBool));
  bool* mp = mask.data_ptr<bool>();
  for (int64_t j = 0; j < m; ++j)
    for (int64_t t = 0; t < len; ++t) mp[j * len + t] = t <= start + j;
  at::Tensor qt = at::from_blob(const_cast<float*>(q), {m, hq, d}, f32).permute({1, 0, 2}).unsqueeze(0);
  at::Tensor o = at::scaled_dot_product_attention(qt, gather(pool_half_k), gather(pool_half_v), mask, 0.0, false, scale,
                                                  hq != hkv);  // [1, Hq, m, D]
  at::from_blob(out, {m, hq, d}, f32).copy_(o[0].permute({1, 0, 2}));
}

}  // namespace kvferry
