"""ServedModel: what is fixed once the engine is built (the model, its names, the KV layout); any
thread may read it. Task threads tokenise and compile grammars with it before they submit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvstore.layout import KVFormat, KVLayout
from workers.engine.grammar.compiler import GrammarCompiler
from workers.engine.model.loader import LoadedModel
from workers.engine.model.precision import FP32, Precision


@dataclass(frozen=True, slots=True)
class ServedModel:
    loaded: LoadedModel
    model_id: str  # the name requests use
    layout: KVLayout
    kv_format: KVFormat
    device: torch.device
    max_model_len: int  # the config's, capped by the model's
    weights_bytes: int  # counted once, after the runner packed the linears
    grammars: GrammarCompiler  # thread-safe
    precision: Precision = FP32  # the weights' and the K/V's (model/precision.py)

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def fingerprint(self) -> str:
        return self.loaded.fingerprint

    @property
    def vocab_size(self) -> int:
        return int(self.loaded.model.config.vocab_size)
