"""The precision an engine computes and caches in: `dtype` (weights and GEMMs) and `kv_cache_dtype`
(the hot pool's K/V), each `auto` or named, resolved once at start-up on the device at hand.

`auto`: bf16 where the hardware computes it natively (a CPU with AVX512-BF16 or AMX, or CUDA),
fp32 elsewhere; the KV cache follows the weights. On CPU a bf16 engine keeps fp32 activations,
norms and softmax, and runs every decoder linear and lm_head on oneDNN's bf16 GEMM over bf16
weights (kernels/bf16_linear.py): the weights are read at half the bytes, the products accumulate
in fp32, the logits are widened to fp32 for sampling. Anything but fp32 weights and fp32 K/V changes the K/V
bytes, so it is part of the chain's root (`fingerprint`), as the weights' own fingerprint is: a
block computed in one precision is never read by an engine of another.

`int8` K/V (opt-in, never `auto`): each token's K and V per KV head are int8 values with their own
fp32 scale (kvstore/pool/int8_rows.py), quantised as written, dequantised by every reader.

`quantization` int8 (CPU): every decoder linear's weights per-channel int8 (kernels/int8_linear.py),
the products in bf16 as a bf16 engine's (so `weights` resolves to bfloat16; float32 is refused).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, cast

import torch
from torch import nn

from workers.engine.model.dtype_names import DTYPES, KV_DTYPES, QUANTIZATIONS

log = logging.getLogger(__name__)
_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "int8"}


class _Loaded(Protocol):  # loader.LoadedModel (which resolves "auto" through this module)
    @property
    def model(self) -> nn.Module: ...

    @property
    def fingerprint(self) -> str: ...


Loaded = TypeVar("Loaded", bound=_Loaded)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 natively: CUDA, or a CPU with AVX512-BF16 or AMX."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


@dataclass(frozen=True, slots=True)
class Precision:
    weights: str  # float32 | bfloat16 | float16
    kv: str  # float32 | bfloat16 | int8
    device: str = "cpu"
    quantization: str = "none"  # none | int8: the decoder linears' weights

    @classmethod
    def resolve(cls, dtype: str, kv_cache_dtype: str, device: str, quantization: str = "none") -> Precision:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if kv_cache_dtype not in KV_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_cache_dtype!r}")
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
        dev = torch.device(device)
        if quantization == "int8":
            if dev.type != "cpu" or dtype not in ("auto", "bfloat16"):
                raise ValueError("quantization int8 runs on CPU, computing in bf16: dtype auto or bfloat16")
            dtype = "bfloat16"
        weights = dtype if dtype != "auto" else ("bfloat16" if native_bf16(dev) else "float32")
        kv = kv_cache_dtype if kv_cache_dtype != "auto" else ("float32" if weights == "float32" else weights)
        return cls(weights, kv, dev.type, quantization)

    @property
    def cpu_mixed(self) -> bool:
        """A CPU engine of bf16 weights: fp32 model, decoder linears converted (bf16_linear.py)."""
        return self.device == "cpu" and self.weights == "bfloat16"

    @property
    def load_dtype(self) -> str:
        """The dtype the weights load in: fp32 on CPU (the bf16 linears are made from it)."""
        return "float32" if self.device == "cpu" else self.weights

    @property
    def kv_torch(self) -> torch.dtype:
        dtype: torch.dtype = getattr(torch, self.kv)
        return dtype

    @property
    def tag(self) -> str:
        """'' for fp32 weights and K/V (the fingerprint stays the weights'), else e.g. '+w-bf16+kv-bf16'
        or '+w-bf16+kv-int8'."""
        if self.weights == "float32" and self.kv == "float32" and self.quantization == "none":
            return ""
        weights = _SHORT[self.weights] if self.quantization == "none" else self.quantization
        return f"+w-{weights}+kv-{_SHORT[self.kv]}"

    @property
    def weights_name(self) -> str:
        """What the heartbeat, /metrics and /version show as the dtype: the weights' (int8 when quantised)."""
        return self.weights if self.quantization == "none" else self.quantization

    def describe(self) -> str:
        quantized = "" if self.quantization == "none" else f" ({self.quantization} weight-only)"
        return f"weights {self.weights}{quantized}, kv cache {self.kv}"

    def apply(self, loaded: Loaded) -> tuple[Loaded, Precision]:
        """Make `loaded`'s model compute in this precision (in place: engines sharing it share
        this); the model with its fingerprint covering the precision, and the precision it runs in
        (fp32 weights where no bf16 GEMM runs here)."""
        from workers.engine.kernels import bf16_linear, int8_linear

        model = loaded.model
        converted = bf16_linear.converted(model)
        quantized = int8_linear.converted(model)
        actual = self
        if self.quantization == "int8":
            if converted:
                raise ValueError("this model's linears were converted to bf16 by another engine")
            if not quantized and int8_linear.convert(model) == 0:
                raise ValueError("quantization int8: torch's int8 or oneDNN's bf16 GEMM does not run here")
            bf16_linear.convert_head(model)
        elif quantized:
            raise ValueError("this model's linears were quantised to int8 by another engine")
        elif self.cpu_mixed:
            if not converted and bf16_linear.convert(model) == 0:
                log.warning("no bf16 GEMM runs here: the weights stay fp32")
                actual = replace(self, weights="float32")
            else:
                bf16_linear.convert_head(model)
        elif converted:
            raise ValueError("this model's linears were converted to bf16 by another engine")
        else:
            have = next(model.parameters()).dtype
            if have != getattr(torch, self.weights):
                model.to(getattr(torch, self.weights))
        log.info("precision: %s", actual.describe())
        marked = replace(cast(Any, loaded), fingerprint=loaded.fingerprint + actual.tag)
        return cast(Loaded, marked), actual


FP32 = Precision("float32", "float32")
