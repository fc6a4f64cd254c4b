// kvferry::decode_layers: every decoder layer of a Llama-family model for a decode-only step
// (one new token per sequence), in one call.
//
// Through transformers' modules a decode step is ~50 torch ops a layer (norms, rotary, residuals,
// views, the attention interface) for a few kilobytes of activations each: on 2 cores ~20 % of
// the step went to dispatching them and to the Python between them, not to the weights. Here each
// layer is: RMSNorm -> q/k/v GEMMs (+bias) -> per-head q/k RMSNorm (Qwen3) -> rotary -> K/V
// written into the pool at their slots -> paged attention over each sequence's block table ->
// o GEMM + residual -> RMSNorm -> gate/up GEMMs -> SiLU(gate) * up -> down GEMM + residual, over
// raw buffers, with the GEMM and the attention of kernels.h. The arithmetic is the modules' own
// (fp32, same formulas); only summation orders differ, as with any change of kernel.
//
// weights: per layer, in this order (an absent bias or norm is an empty tensor):
//   0 input norm [H], 1 wq [Hq*D, H], 2 bq, 3 wk [Hkv*D, H], 4 bk, 5 wv [Hkv*D, H], 6 bv,
//   7 q norm [D], 8 k norm [D], 9 wo [H, Hq*D], 10 bo, 11 post-attention norm [H],
//   12 w_gate [I, H], 13 b_gate, 14 w_up [I, H], 15 b_up, 16 w_down [H, I], 17 b_down.
// hidden [n, H] (updated in place); cos, sin [n, D] (the model's rotary embedding, scaling
// included); kv [layers, 2, slots, Hkv, D] the pool; slots [n]; tables [n, W]; lens [n]
// (context lengths with the new token).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels.h"

namespace {

constexpr int64_t PER_LAYER = 18;

const float* tensor_ptr(const at::Tensor& t, const std::vector<int64_t>& shape, bool optional, int64_t layer,
                        int64_t index) {
  if (optional && t.numel() == 0) return nullptr;
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
              "kvferry::decode_layers: weight ", index, " of layer ", layer, " must be a contiguous fp32 CPU tensor");
  TORCH_CHECK(t.sizes().equals(shape), "kvferry::decode_layers: weight ", index, " of layer ", layer,
              " has shape ", t.sizes(), ", expected ", c10::IntArrayRef(shape));
  return t.data_ptr<float>();
}

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w, for `rows` rows of `width` (transformers' RMSNorm).
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t width, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * width;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < width; ++c) sum += xr[c] * xr[c];
    const float inv = 1.f / std::sqrt(sum / static_cast<float>(width) + eps);
    float* o = out + r * width;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) o[c] = w[c] * (xr[c] * inv);
  }
}

// x[h] = x[h] * cos + rotate_half(x[h]) * sin for each of `heads` heads of row x ([heads, d]).
void rotary(float* x, const float* cos, const float* sin, int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (int64_t j = 0; j < half; ++j) {
      const float a = v[j], b = v[j + half];
      v[j] = a * cos[j] - b * sin[j];
      v[j + half] = b * cos[j + half] + a * sin[j + half];
    }
  }
}

void add_into(float* h, const float* x, int64_t count) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) h[i] += x[i];
}

void decode_layers(at::Tensor hidden, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                   const at::Tensor& slots, const at::Tensor& tables, const at::Tensor& lens,
                   at::TensorList weights, int64_t block_size, double scale, double eps) {
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous() && hidden.device().is_cpu() &&
                  hidden.scalar_type() == at::kFloat,
              "kvferry::decode_layers: hidden must be a contiguous fp32 CPU [n, H]");
  TORCH_CHECK(kv.dim() == 5 && kv.size(1) == 2 && kv.is_contiguous() && kv.device().is_cpu() &&
                  kv.scalar_type() == at::kFloat,
              "kvferry::decode_layers: kv must be the contiguous fp32 CPU pool [layers, 2, slots, Hkv, D]");
  const int64_t n = hidden.size(0), h = hidden.size(1), layers = kv.size(0), num_slots = kv.size(2);
  const int64_t hkv = kv.size(3), d = kv.size(4);
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(weights.size()) == layers * PER_LAYER, "kvferry::decode_layers: ",
              PER_LAYER, " weights per layer, ", layers, " layers: got ", weights.size());
  TORCH_CHECK(weights[1].dim() == 2 && weights[1].size(0) % d == 0, "kvferry::decode_layers: wq must be [Hq*D, H]");
  const int64_t hq = weights[1].size(0) / d, inter = weights[12].dim() == 2 ? weights[12].size(0) : -1;
  TORCH_CHECK(hq % hkv == 0 && d % 2 == 0 && inter > 0, "kvferry::decode_layers: Hq a multiple of Hkv, even D");
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->is_contiguous() && t->device().is_cpu() && t->scalar_type() == at::kFloat &&
                    t->sizes().equals({n, d}),
                "kvferry::decode_layers: cos and sin must be contiguous fp32 CPU [n, D]");
  for (const at::Tensor* t : {&slots, &lens})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kLong && t->dim() == 1 && t->size(0) == n,
                "kvferry::decode_layers: slots and lens must be contiguous int64 [n]");
  TORCH_CHECK(tables.is_contiguous() && tables.scalar_type() == at::kLong && tables.dim() == 2 &&
                  tables.size(0) == n,
              "kvferry::decode_layers: tables must be contiguous int64 [n, W]");
  TORCH_CHECK(block_size > 0 && num_slots % block_size == 0, "kvferry::decode_layers: slots must be whole blocks");
  const int64_t width = tables.size(1);
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  kvferry::check_tables(tp, n, width, lp, block_size, num_slots / block_size);
  for (int64_t i = 0; i < n; ++i) {  // each new token's slot is its context's last one
    const int64_t last = lp[i] - 1;
    TORCH_CHECK(sp[i] == tp[i * width + last / block_size] * block_size + last % block_size,
                "kvferry::decode_layers: slot ", sp[i], " of row ", i, " is not its context's last");
  }

  const int64_t qd = hq * d, kd = hkv * d;
  // Every weight is checked before anything is computed or written: a bad one raises with the
  // pool and hidden untouched.
  const std::vector<std::pair<std::vector<int64_t>, bool>> shapes = {
      {{h}, false},     {{qd, h}, false}, {{qd}, true},     {{kd, h}, false}, {{kd}, true},
      {{kd, h}, false}, {{kd}, true},     {{d}, true},      {{d}, true},      {{h, qd}, false},
      {{h}, true},      {{h}, false},     {{inter, h}, false}, {{inter}, true}, {{inter, h}, false},
      {{inter}, true},  {{h, inter}, false}, {{h}, true}};
  std::vector<const float*> ptrs(layers * PER_LAYER);
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t i = 0; i < PER_LAYER; ++i)
      ptrs[l * PER_LAYER + i] = tensor_ptr(weights[l * PER_LAYER + i], shapes[i].first, shapes[i].second, l, i);
  if (n == 0) return;

  std::vector<float> x(n * h), q(n * qd), k(n * kd), v(n * kd), attn(n * qd), o(n * h), gate(n * inter);
  float* hp = hidden.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* snp = sin.data_ptr<float>();
  const float e = static_cast<float>(eps);
  for (int64_t l = 0; l < layers; ++l) {
    const float* const* w = ptrs.data() + l * PER_LAYER;
    const float *ln1 = w[0], *wq = w[1], *bq = w[2], *wk = w[3], *bk = w[4], *wv = w[5], *bv = w[6];
    const float *qn = w[7], *kn = w[8], *wo = w[9], *bo = w[10], *ln2 = w[11];
    const float *wg = w[12], *bg = w[13], *wu = w[14], *bu = w[15], *wd = w[16], *bd = w[17];

    // Attention block.
    rms_norm(hp, ln1, x.data(), n, h, e);
    const kvferry::Gemm qkv[] = {{wq, qd, bq, q.data()}, {wk, kd, bk, k.data()}, {wv, kd, bv, v.data()}};
    kvferry::skinny_gemms(x.data(), n, h, qkv, 3);
    if (qn != nullptr) rms_norm(q.data(), qn, q.data(), n * hq, d, e);
    if (kn != nullptr) rms_norm(k.data(), kn, k.data(), n * hkv, d, e);
    float* kpool = kv.data_ptr<float>() + l * 2 * num_slots * kd;
    float* vpool = kpool + num_slots * kd;
    for (int64_t i = 0; i < n; ++i) {
      rotary(q.data() + i * qd, cp + i * d, snp + i * d, hq, d);
      rotary(k.data() + i * kd, cp + i * d, snp + i * d, hkv, d);
      std::memcpy(kpool + sp[i] * kd, k.data() + i * kd, sizeof(float) * kd);
      std::memcpy(vpool + sp[i] * kd, v.data() + i * kd, sizeof(float) * kd);
    }
    kvferry::paged_attention(attn.data(), q.data(), n, hq, d, kpool, vpool, hkv, tp, width, lp, block_size,
                             static_cast<float>(scale));
    kvferry::skinny_gemm(attn.data(), n, qd, wo, h, bo, o.data());
    add_into(hp, o.data(), n * h);

    // MLP block.
    rms_norm(hp, ln2, x.data(), n, h, e);
    kvferry::skinny_gated(x.data(), n, h, wg, bg, wu, bu, inter, gate.data());
    kvferry::skinny_gemm(gate.data(), n, inter, wd, h, bd, o.data());
    add_into(hp, o.data(), n * h);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvferry, m) {
  m.def("decode_layers(Tensor(a!) hidden, Tensor cos, Tensor sin, Tensor(b!) kv, Tensor slots, Tensor tables, "
        "Tensor lens, Tensor[] weights, int block_size, float scale, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(kvferry, CPU, m) { m.impl("decode_layers", &decode_layers); }
