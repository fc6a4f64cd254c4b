"""The pool's layout for a model: layers, KV heads and head size from its config."""

from __future__ import annotations

import torch

from kvstore.layout import KVLayout
from workers.engine.model.loader import LoadedModel


def kv_layout(loaded: LoadedModel, block_size: int, dtype: torch.dtype | None = None) -> KVLayout:
    """dtype None: the weights' own."""
    cfg = loaded.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return KVLayout(
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype or next(loaded.model.parameters()).dtype,
    )
