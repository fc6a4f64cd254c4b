// kvferry::decoder_layers: every decoder layer of a Llama-family model for one engine step (prefill
// chunks and decodes), in one call.
//
// Through transformers' modules a decode step is ~50 torch ops a layer (norms, rotary, residuals,
// views, the attention interface) for a few kilobytes of activations each: a sizeable share of the
// step went to dispatching them and to the Python between them, not to the weights
// (docs/benchmarks.md). Here each
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
// (context lengths with the new token); chunks [S]: the row counts of the prefill chunks, which
// come first (rows of one sequence, consecutive positions), each attended in one SDPA call over
// its context; the rows after them attend alone, in place. Every row's K/V is written before any
// row attends. skinny_rows: up to this many rows the linears run kvferry's GEMM, above it ATen's,
// or oneDNN's where `onednn` is set (whichever fused_crossover.py measured faster on this CPU).
// bf16: the linears' weights are bf16 (plain or in oneDNN's layout: kernels/bf16_linear.py); up to
// skinny_rows rows they run kvferry's bf16 GEMM over `plain` (per layer, the 7 linears' plain bf16
// weights in order: q, k, v, o, gate, up, down), above it oneDNN's over `weights` (the input
// rounded to bf16, the output rounded to bf16 and widened to fp32 by either); everything else stays fp32. The pool may be fp32 or bf16 (K/V rounded as written, widened as read),
// or int8 ([layers, 2, slots, Hkv, D + 4]: each row quantised as written with its own scale,
// dequantised as read; kv_rows.cpp).
// int8 (with bf16): per layer, per linear in order, (q int8 [out, in] or empty, s bf16 [out]); the weights are
// q widened to bf16, each linear (x q^T) * s + b (int8_linear.cpp), torch's int8 kernel up to int8_rows rows.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels.h"

namespace {

constexpr int64_t PER_LAYER = 18;

constexpr bool IS_LINEAR[PER_LAYER] = {false, true,  false, true,  false, true,  false, false, false,
                                       true,  false, false, true,  false, true,  false, true,  false};
constexpr int64_t INT8_PER_LAYER = 14;  // (q, s) for each of a layer's 7 linears
constexpr int64_t LINEAR_SLOT[PER_LAYER] = {-1, 0, -1, 1, -1, 2, -1, -1, -1, 3, -1, -1, 4, -1, 5, -1, 6, -1};

const float* tensor_ptr(const at::Tensor& t, const std::vector<int64_t>& shape, bool optional, int64_t layer,
                        int64_t index, bool bf16) {
  if (optional && t.numel() == 0) return nullptr;
  if (bf16 && IS_LINEAR[index]) {  // read by oneDNN only, in whatever layout it was reordered to
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kBFloat16 && t.sizes().equals(shape),
                "kvferry::decoder_layers: weight ", index, " of layer ", layer, " must be a bf16 CPU ",
                c10::IntArrayRef(shape));
    return nullptr;
  }
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
              "kvferry::decoder_layers: weight ", index, " of layer ", layer, " must be a contiguous fp32 CPU tensor");
  TORCH_CHECK(t.sizes().equals(shape), "kvferry::decoder_layers: weight ", index, " of layer ", layer, " has shape ",
              t.sizes(), ", expected ", c10::IntArrayRef(shape));
  return t.data_ptr<float>();
}

void add_into(float* h, const float* x, int64_t count) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) h[i] += x[i];
}

void decoder_layers(at::Tensor hidden, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                    const at::Tensor& slots, const at::Tensor& tables, const at::Tensor& lens, const at::Tensor& chunks,
                    at::TensorList weights, int64_t block_size, double scale, double eps, int64_t skinny_rows,
                    bool onednn, bool bf16, std::optional<at::TensorList> int8_opt, int64_t int8_rows,
                    std::optional<at::TensorList> plain_opt) {
  const at::TensorList int8 = int8_opt.value_or(at::TensorList());
  const at::TensorList plain = plain_opt.value_or(at::TensorList());
  TORCH_CHECK(
      hidden.dim() == 2 && hidden.is_contiguous() && hidden.device().is_cpu() && hidden.scalar_type() == at::kFloat,
      "kvferry::decoder_layers: hidden must be a contiguous fp32 CPU [n, H]");
  TORCH_CHECK(
      kv.dim() == 5 && kv.size(1) == 2 && kv.is_contiguous() && kv.device().is_cpu() &&
          (kv.scalar_type() == at::kFloat || kv.scalar_type() == at::kBFloat16 || kv.scalar_type() == at::kChar),
      "kvferry::decoder_layers: kv must be the contiguous fp32, bf16 or int8 CPU pool [layers, 2, slots, Hkv, row]");
  const int64_t n = hidden.size(0), h = hidden.size(1), layers = kv.size(0), num_slots = kv.size(2);
  const int64_t hkv = kv.size(3), d = kv.size(4) - kvferry::row_elems(kv.scalar_type(), 0);
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(weights.size()) == layers * PER_LAYER,
              "kvferry::decoder_layers: ", PER_LAYER, " weights per layer, ", layers, " layers: got ", weights.size());
  // Hkv and D divide the shapes below: checked first, so a malformed pool raises, never divides by zero.
  TORCH_CHECK(hkv > 0 && d > 0, "kvferry::decoder_layers: kv must have Hkv > 0 heads of D > 0, got Hkv ", hkv, ", D ",
              d);
  TORCH_CHECK(weights[1].dim() == 2 && weights[1].size(0) % d == 0, "kvferry::decoder_layers: wq must be [Hq*D, H]");
  const int64_t hq = weights[1].size(0) / d, inter = weights[12].dim() == 2 ? weights[12].size(0) : -1;
  TORCH_CHECK(hq > 0 && hq % hkv == 0 && d % 2 == 0 && inter > 0,
              "kvferry::decoder_layers: Hq a multiple of Hkv, even D");
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(
        t->is_contiguous() && t->device().is_cpu() && t->scalar_type() == at::kFloat && t->sizes().equals({n, d}),
        "kvferry::decoder_layers: cos and sin must be contiguous fp32 CPU [n, D]");
  for (const at::Tensor* t : {&slots, &lens})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kLong && t->dim() == 1 && t->size(0) == n,
                "kvferry::decoder_layers: slots and lens must be contiguous int64 [n]");
  TORCH_CHECK(tables.is_contiguous() && tables.scalar_type() == at::kLong && tables.dim() == 2 && tables.size(0) == n,
              "kvferry::decoder_layers: tables must be contiguous int64 [n, W]");
  TORCH_CHECK(block_size > 0 && num_slots % block_size == 0, "kvferry::decoder_layers: slots must be whole blocks");
  const int64_t width = tables.size(1);
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  kvferry::check_tables(tp, n, width, lp, block_size, num_slots / block_size);
  for (int64_t i = 0; i < n; ++i) {  // each new token's slot is its context's last one
    const int64_t last = lp[i] - 1;
    TORCH_CHECK(sp[i] == tp[i * width + last / block_size] * block_size + last % block_size,
                "kvferry::decoder_layers: slot ", sp[i], " of row ", i, " is not its context's last");
  }
  // Prefill chunks: rows [0, P) in runs of one sequence each, its positions consecutive; rows
  // [P, n) attend alone, in place.
  TORCH_CHECK(chunks.is_contiguous() && chunks.scalar_type() == at::kLong && chunks.dim() == 1,
              "kvferry::decoder_layers: chunks must be contiguous int64 [S] (rows of each prefill chunk)");
  const int64_t* cl = chunks.data_ptr<int64_t>();
  int64_t prefill_rows = 0;
  for (int64_t c = 0; c < chunks.size(0); ++c) {
    const int64_t r0 = prefill_rows, m = cl[c];
    TORCH_CHECK(m >= 1 && r0 + m <= n, "kvferry::decoder_layers: chunk ", c, " of ", m, " rows past the step's ", n);
    for (int64_t r = r0 + 1; r < r0 + m; ++r)
      TORCH_CHECK(lp[r] == lp[r - 1] + 1 && std::equal(tp + r * width, tp + (r + 1) * width, tp + r0 * width),
                  "kvferry::decoder_layers: rows of chunk ", c, " are not one sequence's consecutive positions");
    prefill_rows += m;
  }

  const int64_t qd = hq * d, kd = hkv * d;
  // Every weight is checked before anything is computed or written: a bad one raises with the
  // pool and hidden untouched.
  const std::vector<std::pair<std::vector<int64_t>, bool>> shapes = {
      {{h}, false},     {{qd, h}, false},    {{qd}, true},        {{kd, h}, false}, {{kd}, true},
      {{kd, h}, false}, {{kd}, true},        {{d}, true},         {{d}, true},      {{h, qd}, false},
      {{h}, true},      {{h}, false},        {{inter, h}, false}, {{inter}, true},  {{inter, h}, false},
      {{inter}, true},  {{h, inter}, false}, {{h}, true}};
  std::vector<const float*> ptrs(layers * PER_LAYER);
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t i = 0; i < PER_LAYER; ++i)
      ptrs[l * PER_LAYER + i] = tensor_ptr(weights[l * PER_LAYER + i], shapes[i].first, shapes[i].second, l, i, bf16);
  const bool quant = !int8.empty();
  TORCH_CHECK(!quant || (bf16 && static_cast<int64_t>(int8.size()) == layers * INT8_PER_LAYER),
              "kvferry::decoder_layers: int8 takes bf16 and ", INT8_PER_LAYER, " tensors a layer");
  if (quant)
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t i = 0; i < PER_LAYER; ++i)
        if (IS_LINEAR[i])
          kvferry::check_int8_linear(int8[l * INT8_PER_LAYER + 2 * LINEAR_SLOT[i]],
                                     int8[l * INT8_PER_LAYER + 2 * LINEAR_SLOT[i] + 1], shapes[i].first[0],
                                     shapes[i].first[1], n <= int8_rows, l, i);
  if (n == 0) return;

  // kvferry's GEMM up to skinny_rows rows (the crossover measured at start-up), ATen's or oneDNN's above;
  // a bf16 stack's over its plain bf16 weights (skinny_bf16.cpp).
  const bool skinny = !quant && n <= skinny_rows;
  std::vector<const c10::BFloat16*> bptrs;  // a bf16 stack's plain weights, 7 a layer (LINEAR_SLOT order)
  if (bf16 && skinny) {
    TORCH_CHECK(static_cast<int64_t>(plain.size()) == layers * 7, "kvferry::decoder_layers: skinny_rows ", skinny_rows,
                " over bf16 weights needs their plain copies, 7 a layer: got ", plain.size());
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t i = 0; i < PER_LAYER; ++i)
        if (IS_LINEAR[i]) {
          const at::Tensor& p = plain[l * 7 + LINEAR_SLOT[i]];
          TORCH_CHECK(p.device().is_cpu() && !p.is_mkldnn() && p.is_contiguous() && p.scalar_type() == at::kBFloat16 &&
                          p.sizes().equals(shapes[i].first),
                      "kvferry::decoder_layers: plain weight ", i, " of layer ", l, " must be a contiguous bf16 CPU ",
                      c10::IntArrayRef(shapes[i].first));
          bptrs.push_back(p.data_ptr<c10::BFloat16>());
        }
  }
  const auto gemm = bf16 ? kvferry::onednn_bf16_linear : onednn ? kvferry::onednn_linear : kvferry::aten_linear;
  const bool int8_kernel = n <= int8_rows;
  const at::Tensor *t = nullptr, *qs = nullptr;  // the layer's weights (the large GEMM's), its int8 ones
  auto large_linear = [&](const float* in, int64_t rows, const at::Tensor& w, const at::Tensor& b, float* out) {
    if (!quant) return gemm(in, rows, w, b, out);
    const int64_t slot = LINEAR_SLOT[&w - t];  // w is t[i]: its index in the layer
    kvferry::int8_linear(in, rows, w, qs[2 * slot], qs[2 * slot + 1], b, out, int8_kernel);
  };
  const int64_t kv_slot_bytes = hkv * kv.size(4) * kv.element_size();  // one slot of one layer's K (or V)
  std::vector<float> x(n * h), q(n * qd), k(n * kd), v(n * kd), attn(n * qd), o(n * h), gate(n * inter),
      up(skinny && !bf16 ? 0 : n * inter);
  float* hp = hidden.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* snp = sin.data_ptr<float>();
  const float e = static_cast<float>(eps);
  for (int64_t l = 0; l < layers; ++l) {
    const float* const* w = ptrs.data() + l * PER_LAYER;
    const float *ln1 = w[0], *wq = w[1], *bq = w[2], *wk = w[3], *bk = w[4], *wv = w[5], *bv = w[6];
    const float *qn = w[7], *kn = w[8], *wo = w[9], *bo = w[10], *ln2 = w[11];
    const float *wg = w[12], *bg = w[13], *wu = w[14], *bu = w[15], *wd = w[16], *bd = w[17];
    t = weights.data() + l * PER_LAYER, qs = quant ? int8.data() + l * INT8_PER_LAYER : nullptr;
    const c10::BFloat16* const* bw = bptrs.empty() ? nullptr : bptrs.data() + l * 7;

    // Attention block.
    kvferry::rms_norm(hp, ln1, x.data(), n, h, e);
    if (skinny && bf16) {
      const kvferry::Bf16Gemm qkv[] = {{bw[0], qd, bq, q.data()}, {bw[1], kd, bk, k.data()}, {bw[2], kd, bv, v.data()}};
      kvferry::skinny_bf16_gemms(x.data(), n, h, qkv, 3);
    } else if (skinny) {
      const kvferry::Gemm qkv[] = {{wq, qd, bq, q.data()}, {wk, kd, bk, k.data()}, {wv, kd, bv, v.data()}};
      kvferry::skinny_gemms(x.data(), n, h, qkv, 3);
    } else {
      large_linear(x.data(), n, t[1], t[2], q.data());
      large_linear(x.data(), n, t[3], t[4], k.data());
      large_linear(x.data(), n, t[5], t[6], v.data());
    }
    if (qn != nullptr) kvferry::rms_norm(q.data(), qn, q.data(), n * hq, d, e);
    if (kn != nullptr) kvferry::rms_norm(k.data(), kn, k.data(), n * hkv, d, e);
    char* kpool = static_cast<char*>(kv.data_ptr()) + l * 2 * num_slots * kv_slot_bytes;
    char* vpool = kpool + num_slots * kv_slot_bytes;
    for (int64_t i = 0; i < n; ++i) {
      kvferry::rotary(q.data() + i * qd, cp + i * d, snp + i * d, hq, d);
      kvferry::rotary(k.data() + i * kd, cp + i * d, snp + i * d, hkv, d);
      kvferry::store_kv(kpool, vpool, kv.scalar_type(), sp[i], k.data() + i * kd, v.data() + i * kd, hkv, d);
    }
    for (int64_t c = 0, r0 = 0; c < chunks.size(0); r0 += cl[c++])
      kvferry::chunk_attention(attn.data() + r0 * qd, q.data() + r0 * qd, cl[c], hq, d, kpool, vpool, kv.scalar_type(),
                      num_slots / block_size, hkv, tp + r0 * width, lp[r0 + cl[c] - 1], block_size, scale);
    kvferry::paged_attention(attn.data() + prefill_rows * qd, q.data() + prefill_rows * qd, n - prefill_rows, hq, d,
                             kpool, vpool, kv.scalar_type(), hkv, tp + prefill_rows * width, width, lp + prefill_rows,
                             block_size, static_cast<float>(scale));
    if (skinny && bf16) {
      const kvferry::Bf16Gemm out_proj{bw[3], h, bo, o.data()};
      kvferry::skinny_bf16_gemms(attn.data(), n, qd, &out_proj, 1);
    } else if (skinny) {
      kvferry::skinny_gemm(attn.data(), n, qd, wo, h, bo, o.data());
    } else {
      large_linear(attn.data(), n, t[9], t[10], o.data());
    }
    add_into(hp, o.data(), n * h);

    // MLP block.
    kvferry::rms_norm(hp, ln2, x.data(), n, h, e);
    if (skinny && !bf16) {
      kvferry::skinny_gated(x.data(), n, h, wg, bg, wu, bu, inter, gate.data());
      kvferry::skinny_gemm(gate.data(), n, inter, wd, h, bd, o.data());
    } else {
      if (skinny) {
        const kvferry::Bf16Gemm gate_up[] = {{bw[4], inter, bg, gate.data()}, {bw[5], inter, bu, up.data()}};
        kvferry::skinny_bf16_gemms(x.data(), n, h, gate_up, 2);
      } else {
        large_linear(x.data(), n, t[12], t[13], gate.data());
        large_linear(x.data(), n, t[14], t[15], up.data());
      }
      float* g = gate.data();
      const float* u = up.data();
      at::parallel_for(0, n * inter, 4096, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];  // SiLU(gate) * up
      });
      if (skinny) {
        const kvferry::Bf16Gemm down{bw[6], h, bd, o.data()};
        kvferry::skinny_bf16_gemms(gate.data(), n, inter, &down, 1);
      } else {
        large_linear(gate.data(), n, t[16], t[17], o.data());
      }
    }
    add_into(hp, o.data(), n * h);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvferry, m) {
  m.def(
      "decoder_layers(Tensor(a!) hidden, Tensor cos, Tensor sin, Tensor(b!) kv, Tensor slots, Tensor tables, "
      "Tensor lens, Tensor chunks, Tensor[] weights, int block_size, float scale, float eps, int skinny_rows, "
      "bool onednn=False, bool bf16=False, Tensor[]? int8=None, int int8_rows=0, Tensor[]? plain=None) -> ()");
}

TORCH_LIBRARY_IMPL(kvferry, CPU, m) { m.impl("decoder_layers", &decoder_layers); }
// A bf16 engine passes weights reordered into oneDNN's layout (opaque MkldnnCPU tensors): the same op.
TORCH_LIBRARY_IMPL(kvferry, MkldnnCPU, m) { m.impl("decoder_layers", &decoder_layers); }
