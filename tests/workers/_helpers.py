"""Shared helpers for the engine tests: engines sized in blocks, a checked step loop, HF references."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel

from broker.sampling import SamplingParams
from ops.bench.engine.hf_baseline import hf_greedy
from workers.engine.config import EngineConfig
from workers.engine.factory import build_engine, bytes_per_block
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import LoadedModel
from workers.engine.model.precision import Precision
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest

VOCAB = 49152  # SmolLM2's tokenizer; the tiny models use the same vocabulary
# Random models have no meaningful EOS: the reference never stops early, so neither may the engine.
NO_EOS = {"ignore_eos": True}


@dataclass
class Reference:
    """An HF model with its own config object (never the engine's), answering greedy `generate`."""

    model: PreTrainedModel
    _memo: dict[tuple[tuple[int, ...], int], list[int]] = field(default_factory=dict)

    def greedy(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """HF greedy continuation of one prompt at batch 1: the ground truth. Memoised."""
        key = (tuple(prompt), max_new_tokens)
        if key not in self._memo:
            self._memo[key] = hf_greedy(self.model, list(prompt), max_new_tokens)
        return self._memo[key]

    def __repr__(self) -> str:  # keeps pytest's failure reports free of weights and memo dumps
        return f"Reference({type(self.model).__name__})"


@dataclass(frozen=True)
class TinyModel:
    """A tiny random model wrapped for the engine, plus an identical, independent HF reference."""

    loaded: LoadedModel
    reference: Reference

    def expected(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        return self.reference.greedy(prompt, max_new_tokens)

    def __repr__(self) -> str:
        return f"TinyModel({self.loaded.model_id})"


def make_engine(loaded: LoadedModel, num_blocks: int, **config: Any) -> LLMEngine:
    """An engine whose pool holds exactly `num_blocks` blocks; fp32 unless `dtype` says otherwise
    (the exactness tests compare against HF fp32)."""
    config.setdefault("dtype", "float32")
    kv = Precision.resolve(config["dtype"], config.get("kv_cache_dtype", "auto"), "cpu").kv_torch
    per_block = bytes_per_block(loaded, config.get("block_size", 16), kv)
    engine = build_engine(
        EngineConfig(model=loaded.model_id, cache_size_bytes=num_blocks * per_block, **config), loaded
    )
    assert engine.pool.num_blocks == num_blocks
    return engine


def run_checked(
    engine: LLMEngine,
    requests: Mapping[str, tuple[Sequence[int], SamplingParams]] | None = None,
    max_steps: int = 5000,
) -> dict[str, RequestOutput]:
    """Add `requests`, then step by hand until nothing is unfinished, checking the engine's and the
    pool's invariants after every step. Returns each request's final output; asserts none leaked."""
    for request_id, (prompt, params) in (requests or {}).items():
        engine.add_request(GenerationRequest(request_id, list(prompt), params))
    engine.check_integrity()
    done: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            if out.finished:
                assert out.request_id not in done, f"{out.request_id} finished twice"
                done[out.request_id] = out
        engine.check_integrity()
    else:
        raise AssertionError(f"engine still unfinished after {max_steps} steps: {engine.stats()}")
    assert engine.pool.stats().blocks_used == 0, f"blocks leaked: {engine.pool.stats()}"
    return done


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(length)]


def chat_prompt(tokenizer: Any, question: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat, ready for the assistant's answer."""
    messages = [{"role": "user", "content": question}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    ids: list[int] = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return ids


def assert_tokens(got: Sequence[int], want: Sequence[int], what: str) -> None:
    """Token-exact comparison whose message names the case and the first diverging position."""
    got, want = list(got), list(want)
    if got == want:
        return
    at = next(
        (i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), min(len(got), len(want))
    )
    raise AssertionError(
        f"{what}: outputs diverge at output token {at} (engine {len(got)} tokens, HF {len(want)})\n"
        f"  engine: {got}\n  HF:     {want}"
    )


def pack_history(source: LLMEngine, history: Sequence[int], block_size: int = 16) -> bytes:
    """The full blocks of `history` from `source`'s pool (it ran them), as one Redis-tier pack."""
    from kvstore.chain import hash_blocks
    from kvstore.tiers.codec import encode_pack
    from kvstore.tiers.stored_block import StoredBlock

    parent = source.scheduler.blocks.root("")
    blocks = []
    for i, h in enumerate(hash_blocks(list(history), block_size, (), parent=parent)):
        tokens = history[i * block_size : (i + 1) * block_size]
        cached = source.pool.get_cached_block(h, list(tokens))
        assert cached is not None
        blocks.append(
            StoredBlock(h, parent, tuple(tokens), source.executor.kv_cache.read_block(cached.block_id))
        )
        parent = h
    return encode_pack(source.served.kv_format, blocks)


def move_history(source: LLMEngine, target: LLMEngine, history: list[int]) -> bytes:
    """`history` computed on `source`, packed, decoded into `target`'s warm tier; the pack."""
    from kvstore.tiers.codec import decode_pack

    assert target.tiers is not None
    run_checked(source, {"history": (history, SamplingParams(max_tokens=1, **NO_EOS))})
    pack = pack_history(source, history)
    decoded = decode_pack(target.served.kv_format, pack)
    assert decoded.reason is None and len(decoded.blocks) == len(history) // 16
    for block in decoded.blocks:
        target.tiers.warm.put(block)
    return pack


def moved_and_kept(
    source: LLMEngine, target: LLMEngine, history: list[int], turn: list[int], params: SamplingParams
) -> tuple[RequestOutput, RequestOutput]:
    """`turn` on `target` (its history from the moved blocks) and on `source` (its pool)."""
    got = run_checked(target, {"turn": (turn, params)})["turn"]
    kept = run_checked(source, {"turn": (turn, params)})["turn"]
    assert got.warm_tokens == len(history) and kept.pool_tokens == len(history)
    return got, kept


def warm_and_kept(
    loaded: LoadedModel, seed: int, **config: Any
) -> tuple[RequestOutput, RequestOutput, RequestOutput]:
    """One turn over a 4-block history on two engines of `config`: (from the warm tier of one that
    evicted it, from the pool of one that kept it, the kept one's second run of it)."""
    rng = random.Random(seed)
    system = random_prompt(rng, 64)  # 4 full blocks
    first = [*system, *random_prompt(rng, 9)]
    filler = [random_prompt(rng, 70) for _ in range(3)]
    again = [*system, *random_prompt(rng, 11)]
    params = SamplingParams(max_tokens=8, **NO_EOS)
    evicting = make_engine(loaded, num_blocks=8, warm_cache_size_bytes=1 << 20, **config)
    keeping = make_engine(loaded, num_blocks=64, **config)
    from workers.engine.kernels import paged_decode

    # where the kernels build, both run the fused stack
    assert (evicting.executor.runner.fused is not None) == paged_decode.available()
    for engine in (evicting, keeping):
        run_checked(engine, {"first": (first, params)})
    from_pool = run_checked(keeping, {"again": (again, params)})["again"]
    for i, prompt in enumerate(filler):
        run_checked(evicting, {f"filler{i}": (prompt, params)})
    got = run_checked(evicting, {"again": (again, params)})["again"]
    kept = run_checked(keeping, {"again": (again, params)})["again"]
    assert got.warm_tokens == 64 and kept.pool_tokens == from_pool.pool_tokens == 64
    return got, kept, from_pool
