"""FusedDecoder: a step's whole decoder stack in one C++ call (csrc/decoder_layers.cpp).

Through transformers' modules a decode step of SmolLM2 (30 layers, 16 sequences) dispatches ~1,500
torch ops over a few kilobytes of activations each, and their dispatch is a sizeable share of the
step beside the linears and the attention that do the work (docs/benchmarks.md).
`kvferry::decoder_layers` runs every layer (norms, q/k/v, rotary, the K/V write into the pool, paged
attention, o, the MLP, residuals) over raw buffers, calling the same kernels the modules call:
kvferry's GEMM (above the crossover measured by crossover.py, ATen's or oneDNN's, whichever
fused_crossover.py measured faster here), the in-place attention for decodes, and one SDPA call over
the gathered context for each prefill chunk. The embedding, the rotary table (the model's own
module, so any rope scaling holds), the final norm and lm_head stay the model's.

It applies on CPU fp32 activations to a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3:
optional biases and q/k norms) whose linears all run kvferry's GEMM, or all are bf16
(bf16_linear.py: a bf16 engine; kvferry's bf16 GEMM over their plain copies up to its crossover,
oneDNN's above), or all are int8 (int8_linear.py: their int8 weights and scales go
in beside the bf16 copies, with the row count up to which torch's int8 kernel runs), and whose
decodes run the in-place attention kernel (both probed at start-up), over an fp32, bf16 or int8 pool,
with SiLU, one RMSNorm eps and no sliding window. Anything else keeps the modules' forward."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kvstore.pool.kv_cache import KVCache
from workers.engine.kernels import fused_crossover
from workers.engine.kernels.bf16_linear import Bf16Linear
from workers.engine.kernels.fused_crossover import FusedPlan
from workers.engine.kernels.int8_linear import Int8Linear
from workers.engine.kernels.packed_linear import SkinnyLinear

MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_EMPTY = torch.empty(0)  # an absent bias or norm


def _linears(layer: Any) -> list[Any]:
    """A decoder layer's 7 linears: q, k, v, o, gate, up, down."""
    return [getattr(layer.self_attn, n) for n in _ATTN] + [getattr(layer.mlp, n) for n in _MLP]


def _eps(norm: Any) -> float | None:
    """The eps of a transformers RMSNorm (weight * x * rsqrt(mean(x^2) + eps)); None otherwise."""
    if norm is None or not type(norm).__name__.endswith("RMSNorm") or not hasattr(norm, "variance_epsilon"):
        return None
    return float(norm.variance_epsilon)


def _layer_weights(layer: Any) -> tuple[list[torch.Tensor], set[float]] | None:
    """The 18 tensors decoder_layers.cpp reads for one layer, in its order, and the RMSNorm eps
    values met; None where the layer is not of the shape it computes."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or getattr(attn, "sliding_window", None) is not None:
        return None
    found = {n: getattr(attn, n, None) for n in _ATTN} | {n: getattr(mlp, n, None) for n in _MLP}
    linears: dict[str, SkinnyLinear | Bf16Linear | Int8Linear] = {}
    for kind in (SkinnyLinear, Bf16Linear, Int8Linear):
        if len(linears) != len(found):
            linears = {n: m for n, m in found.items() if isinstance(m, kind)}
    if len(linears) != len(found):
        return None
    norms = [getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)]
    head_norms = [getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)]
    if any(_eps(n) is None for n in norms) or any(n is not None and _eps(n) is None for n in head_norms):
        return None
    eps = {_eps(n) for n in norms + head_norms if n is not None}

    def w(name: str) -> torch.Tensor:
        return linears[name].weight.detach()

    def b(name: str) -> torch.Tensor:
        bias = linears[name].bias
        return _EMPTY if bias is None else bias.detach()

    def norm(module: Any) -> torch.Tensor:
        return _EMPTY if module is None else module.weight.detach()

    weights = [norm(norms[0]), w("q_proj"), b("q_proj"), w("k_proj"), b("k_proj"), w("v_proj"), b("v_proj")]
    weights += [norm(head_norms[0]), norm(head_norms[1]), w("o_proj"), b("o_proj"), norm(norms[1])]
    weights += [w("gate_proj"), b("gate_proj"), w("up_proj"), b("up_proj"), w("down_proj"), b("down_proj")]
    return weights, {e for e in eps if e is not None}


class FusedDecoder:
    """Not thread-safe (the model runner's thread owns it)."""

    def __init__(
        self,
        decoder: Any,
        kv_cache: KVCache,
        weights: list[torch.Tensor],
        scale: float,
        eps: float,
        plan: FusedPlan,
        bf16: bool = False,
        int8: tuple[list[torch.Tensor], int] = ([], 0),
        plain: list[torch.Tensor] | None = None,
    ) -> None:
        self.decoder = decoder  # the model's base model: embed_tokens, rotary_emb, norm
        self.kv_cache = kv_cache
        self.weights = weights
        self.scale = scale
        self.eps = eps
        self.plan = plan
        self.bf16 = bf16  # the linears' weights are bf16 (kvferry's and oneDNN's bf16 GEMMs)
        self.int8, self.int8_rows = int8  # (q, s) of each linear, int8_linear.py's crossover
        self.plain = plain or []  # a bf16 stack's plain weights for kvferry's GEMM, 7 a layer

    @classmethod
    def build(cls, model: nn.Module, kv_cache: KVCache) -> FusedDecoder | None:
        """The fused stack for `model`'s decoder over `kv_cache`, or None where it does not apply
        (see the module's docstring). Needs kvferry's CPU kernels loaded (the linears are
        SkinnyLinear only then)."""
        config: Any = model.config
        decoder: Any = getattr(model, str(model.base_model_prefix), None)
        pool = kv_cache.tensor
        if (
            decoder is None
            or config.model_type not in MODEL_TYPES
            or getattr(config, "hidden_act", None) != "silu"
            or (config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None)
            or pool.device.type != "cpu"
            or pool.dtype not in (torch.float32, torch.bfloat16, torch.int8)
            or not all(hasattr(decoder, n) for n in ("embed_tokens", "rotary_emb", "norm", "layers"))
            or not hasattr(torch.ops.kvferry, "decoder_layers")
        ):
            return None
        weights: list[torch.Tensor] = []
        eps: set[float] = set()
        scales = set()
        for layer in decoder.layers:
            found = _layer_weights(layer)
            if found is None:
                return None
            weights += found[0]
            eps |= found[1]
            scales.add(float(layer.self_attn.scaling))
        if len(eps) != 1 or len(scales) != 1:
            return None
        first = decoder.layers[0]
        linears = _linears(first)
        every_row = FusedPlan(True, None)
        if all(isinstance(m, Bf16Linear) for m in linears):  # kvferry's bf16 GEMM to its rows, oneDNN's above
            plain = [m.plain_weight for layer in decoder.layers for m in _linears(layer)]
            kept = [p for p in plain if p is not None] if first.self_attn.q_proj.max_rows > 0 else []
            return cls(decoder, kv_cache, weights, scales.pop(), eps.pop(), every_row, bf16=True, plain=kept)
        if all(isinstance(m, Int8Linear) for m in linears):
            int8 = [t for layer in decoder.layers for m in _linears(layer) for t in (m.qweight, m.scales)]
            plan = (int8, int(first.self_attn.q_proj.max_int8_rows))
            return cls(decoder, kv_cache, weights, scales.pop(), eps.pop(), every_row, bf16=True, int8=plan)
        if not all(isinstance(m, SkinnyLinear) for m in linears):
            return None
        return cls(decoder, kv_cache, weights, scales.pop(), eps.pop(), fused_crossover.plan(linears))

    @property
    def skinny_rows(self) -> int:
        """Up to this many rows a step the linears run kvferry's GEMM, above it ATen's or oneDNN's:
        the crossover pack_linears (bf16: bf16_linear.convert) measured for this model; none for a
        bf16 stack without the plain weights it reads."""
        if self.bf16 and len(self.plain) != 7 * len(self.decoder.layers):
            return 0
        return int(self.decoder.layers[0].self_attn.q_proj.max_rows)

    def takes(self, rows: int) -> bool:
        """Whether a step of `rows` rows runs here (else through the modules): see FusedPlan."""
        return self.plan.max_rows is None or rows <= self.plan.max_rows

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        blocks: torch.Tensor,
        lens: torch.Tensor,
        chunks: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states [n, H] after the final norm, for n rows (a prefill chunk's tokens, or a
        decode each): input_ids, positions, slots [n] (each new token's pool slot: its context's
        last), blocks [n, W] and lens [n] (each row's block table and context length, its own token
        included); chunks [S] the row counts of the prefill chunks, which come first."""
        hidden = self.decoder.embed_tokens(input_ids)  # [n, H], a fresh tensor: updated in place
        cos, sin = self.decoder.rotary_emb(hidden, positions[None])  # [1, n, D] each
        torch.ops.kvferry.decoder_layers(
            hidden,
            cos[0].contiguous(),
            sin[0].contiguous(),
            self.kv_cache.tensor,
            slots,
            blocks,
            lens,
            chunks,
            self.weights,
            self.kv_cache.layout.block_size,
            self.scale,
            self.eps,
            self.skinny_rows,
            self.plan.onednn,
            self.bf16,
            self.int8,
            self.int8_rows,
            self.plain,
        )
        return self.decoder.norm(hidden)
