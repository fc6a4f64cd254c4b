// The pool's rows, for the kernels that write and read it in place (decoder_layers.cpp,
// paged_decode.cpp): one token's K (or V) of one KV head is a row of D elements, fp32 or bf16, or
// in an int8 pool D int8 values followed by the row's fp32 scale (4 bytes): value = int8 * scale,
// scale = absmax / 127, the values rounded half to even and clamped to +-127. The arithmetic is
// kvstore/pool/int8_rows.py's, so either path writes the same bytes for the same K/V.
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace {

void quantize_row(int8_t* dst, const float* x, int64_t d) {
  float m = 0.f;
  for (int64_t j = 0; j < d; ++j) m = std::max(m, std::fabs(x[j]));
  const float s = m > 0.f ? m / 127.f : 1.f;
  for (int64_t j = 0; j < d; ++j) dst[j] = static_cast<int8_t>(std::clamp(std::nearbyint(x[j] / s), -127.f, 127.f));
  std::memcpy(dst + d, &s, sizeof s);
}

}  // namespace

namespace kvferry {

int64_t row_elems(at::ScalarType type, int64_t d) { return type == at::kChar ? d + INT8_SCALE_BYTES : d; }

void store_kv(char* k_pool, char* v_pool, at::ScalarType type, int64_t slot, const float* k, const float* v,
              int64_t hkv, int64_t d) {
  const int64_t kd = hkv * d;
  if (type == at::kChar) {
    const int64_t row = d + INT8_SCALE_BYTES;
    auto* kq = reinterpret_cast<int8_t*>(k_pool) + slot * hkv * row;
    auto* vq = reinterpret_cast<int8_t*>(v_pool) + slot * hkv * row;
    for (int64_t h = 0; h < hkv; ++h) {
      quantize_row(kq + h * row, k + h * d, d);
      quantize_row(vq + h * row, v + h * d, d);
    }
  } else if (type == at::kBFloat16) {  // rounded to nearest even, as torch's .to(bfloat16)
    auto* k16 = reinterpret_cast<c10::BFloat16*>(k_pool) + slot * kd;
    auto* v16 = reinterpret_cast<c10::BFloat16*>(v_pool) + slot * kd;
    for (int64_t j = 0; j < kd; ++j) {
      k16[j] = c10::BFloat16(k[j]);
      v16[j] = c10::BFloat16(v[j]);
    }
  } else {
    TORCH_CHECK(type == at::kFloat, "kvferry: a pool of fp32, bf16 or int8 K/V");
    std::memcpy(reinterpret_cast<float*>(k_pool) + slot * kd, k, sizeof(float) * kd);
    std::memcpy(reinterpret_cast<float*>(v_pool) + slot * kd, v, sizeof(float) * kd);
  }
}

at::Tensor widen_rows(const at::Tensor& rows, int64_t d) {
  if (rows.scalar_type() != at::kChar) return rows.to(at::kFloat);
  const at::Tensor scale = rows.narrow(-1, d, INT8_SCALE_BYTES).contiguous().view(at::kFloat);  // [..., 1]
  return rows.narrow(-1, 0, d).to(at::kFloat).mul(scale);
}

}  // namespace kvferry
