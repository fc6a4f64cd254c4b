"""The baselines the engine benchmark measures against: random prompts and HF `generate` on a
copy of the same weights (sdpa attention)."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from workers.engine.model.loader import LoadedModel


def prompt(rng: torch.Generator, n: int, vocab: int) -> list[int]:
    # Token ids 100.. avoid the special tokens at the start of the vocabulary.
    return torch.randint(100, vocab, (n,), generator=rng).tolist()


def hf_model(loaded: LoadedModel) -> Any:
    ref = type(loaded.model)(copy.deepcopy(loaded.model.config))
    ref.config._attn_implementation = "sdpa"
    ref.load_state_dict(loaded.model.state_dict())
    ref.generation_config = copy.deepcopy(loaded.model.generation_config)
    return ref.eval()


@torch.inference_mode()
def hf_greedy(ref: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """HF `generate`'s greedy continuation of one prompt at batch 1: the ground truth that tests
    and `kvferry chaos` hold the engine to."""
    ids = torch.tensor([prompt])
    out = ref.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=ref.generation_config.pad_token_id or 0,
    )
    return list(out[0, len(prompt) :].tolist())


@torch.inference_mode()
def hf_generate(ref: Any, prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    ref.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
    )
    return time.perf_counter() - started
