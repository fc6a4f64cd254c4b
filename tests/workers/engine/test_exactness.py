"""Greedy outputs are token-exact with HF `generate` at batch 1, however the engine batches them."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.kernels import paged_decode as kernel
from workers.engine.requests.request import GenerationRequest


def test_32_concurrent_prompts_are_batched_and_exact(tiny: TinyModel) -> None:
    rng = random.Random(1)
    lengths = [3 + (i * 117) // 31 for i in range(32)]  # 3 .. 120
    rng.shuffle(lengths)
    prompts = {f"r{i}": random_prompt(rng, n) for i, n in enumerate(lengths)}
    params = SamplingParams(max_tokens=20, **NO_EOS)
    engine = make_engine(tiny.loaded, num_blocks=320)

    outs = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})

    for rid, prompt in prompts.items():
        assert outs[rid].finish_reason == "length"
        assert_tokens(
            outs[rid].token_ids, tiny.expected(prompt, 20), f"{rid}, prompt of {len(prompt)} tokens"
        )
    stats = engine.stats()
    assert stats.max_batch_seqs == 32, f"the 32 requests never ran in one step: {stats}"
    assert stats.num_preemptions == 0
    assert stats.generation_tokens == 32 * 20
    assert stats.prompt_tokens_computed == sum(lengths)


def test_generate_returns_outputs_in_prompt_order(tiny: TinyModel) -> None:
    rng = random.Random(2)
    prompts = [random_prompt(rng, n) for n in (40, 5, 23)]
    per_request = [SamplingParams(max_tokens=m, **NO_EOS) for m in (3, 9, 6)]
    engine = make_engine(tiny.loaded, num_blocks=32)

    outs = engine.generate(prompts, per_request)

    for prompt, params, out in zip(prompts, per_request, outs, strict=True):
        assert out.prompt_tokens == len(prompt)
        assert_tokens(out.token_ids, tiny.expected(prompt, params.max_tokens or 0), f"{len(prompt)} tokens")
    engine.check_integrity()


@pytest.mark.parametrize("budget", [32, 20, 17])
def test_chunked_prefill_of_a_100_token_prompt_is_exact(tiny: TinyModel, budget: int) -> None:
    """Chunks of `budget` tokens; 20 and 17 put chunk edges inside blocks."""
    prompt = random_prompt(random.Random(3), 100)
    engine = make_engine(tiny.loaded, num_blocks=16, max_num_batched_tokens=budget)

    outs = run_checked(engine, {"long": (prompt, SamplingParams(max_tokens=12, **NO_EOS))})

    assert_tokens(outs["long"].token_ids, tiny.expected(prompt, 12), f"100 tokens, budget {budget}")
    stats = engine.stats()
    assert stats.max_batch_tokens == budget
    assert stats.num_steps == -(-100 // budget) + 11  # prefill chunks, then one step per later token


def test_chunked_prefill_shares_steps_with_decodes(tiny: TinyModel) -> None:
    """A long prompt arrives while another request decodes: each step carries the decode plus a
    20-token prefill chunk, so chunk edges fall inside blocks."""
    rng = random.Random(4)
    short, long = random_prompt(rng, 10), random_prompt(rng, 90)
    engine = make_engine(tiny.loaded, num_blocks=32, max_num_batched_tokens=21)
    params = SamplingParams(max_tokens=30, **NO_EOS)
    engine.add_request(GenerationRequest("short", short, params))
    engine.step()  # prefill of the short prompt alone
    engine.check_integrity()

    outs = run_checked(engine, {"long": (long, params)})

    assert_tokens(outs["short"].token_ids, tiny.expected(short, 30), "decoding while a prompt is chunked")
    assert_tokens(outs["long"].token_ids, tiny.expected(long, 30), "90 tokens chunked beside a decode")
    assert engine.stats().max_batch_seqs == 2
    assert engine.stats().max_batch_tokens == 21


def test_one_token_prefill_chunks_ride_with_decodes(tiny: TinyModel) -> None:
    """Three decodes fill a 4-token budget but one slot: the long prompt advances one token a step
    through the single-token path, without sampling until its last token."""
    rng = random.Random(15)
    neighbours = {f"n{i}": random_prompt(rng, 1) for i in range(3)}
    long = random_prompt(rng, 10)
    engine = make_engine(tiny.loaded, num_blocks=40, block_size=4, max_num_batched_tokens=4)
    requests = {rid: (p, SamplingParams(max_tokens=20, **NO_EOS)) for rid, p in neighbours.items()}
    requests["long"] = (long, SamplingParams(max_tokens=6, **NO_EOS))

    outs = run_checked(engine, requests)

    for rid, prompt in neighbours.items():
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 20), f"{rid}, 1-token prompt")
    assert_tokens(outs["long"].token_ids, tiny.expected(long, 6), "10 tokens, one per step")
    assert engine.stats().max_batch_tokens == 4


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_other_architectures_are_exact(tiny_model: Callable[[str], TinyModel], arch: str) -> None:
    """Qwen2 (q/k/v bias), Qwen3 (bias plus q/k norms), Mistral: batched, then a prefix hit."""
    model = tiny_model(arch)
    rng = random.Random(5)
    prompts = [random_prompt(rng, n) for n in (7, 33, 70)]
    engine = make_engine(model.loaded, num_blocks=48)
    params = SamplingParams(max_tokens=16, **NO_EOS)

    outs = engine.generate(prompts, params)
    again = engine.generate([prompts[2]], params)[0]

    for prompt, out in zip(prompts, outs, strict=True):
        assert_tokens(out.token_ids, model.expected(prompt, 16), f"{arch}, {len(prompt)} tokens")
    assert again.cached_tokens == 64
    assert_tokens(again.token_ids, model.expected(prompts[2], 16), f"{arch}, repeated, 64 cached")
    engine.check_integrity()


@pytest.mark.parametrize("block_size", [1, 7, 32])
def test_other_block_sizes_are_exact(tiny: TinyModel, block_size: int) -> None:
    rng = random.Random(6)
    prompts = [random_prompt(rng, n) for n in (1, 13, 50)]
    engine = make_engine(tiny.loaded, num_blocks=400 // block_size + 8, block_size=block_size)
    params = SamplingParams(max_tokens=10, **NO_EOS)

    outs = run_checked(engine, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    repeat = run_checked(engine, {"again": (prompts[2], params)})["again"]

    for i, prompt in enumerate(prompts):
        assert_tokens(outs[f"r{i}"].token_ids, tiny.expected(prompt, 10), f"bs {block_size}, {len(prompt)}")
    assert repeat.cached_tokens == 49 // block_size * block_size
    assert_tokens(repeat.token_ids, tiny.expected(prompts[2], 10), f"bs {block_size}, repeated prompt")


def test_max_num_seqs_queues_the_rest(tiny: TinyModel) -> None:
    rng = random.Random(7)
    prompts = {f"r{i}": random_prompt(rng, 5 + 9 * i) for i in range(6)}
    engine = make_engine(tiny.loaded, num_blocks=64, max_num_seqs=2)
    params = SamplingParams(max_tokens=8, **NO_EOS)

    outs = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})

    for rid, prompt in prompts.items():
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 8), f"{rid}, {len(prompt)} tokens")
    assert engine.stats().max_batch_seqs == 2


def test_prefix_caching_disabled_is_exact_and_never_hits(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(8), 40)
    engine = make_engine(tiny.loaded, num_blocks=16, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=10, **NO_EOS)

    first = run_checked(engine, {"a": (prompt, params)})["a"]
    second = run_checked(engine, {"b": (prompt, params)})["b"]

    assert (first.cached_tokens, second.cached_tokens) == (0, 0)
    assert_tokens(first.token_ids, tiny.expected(prompt, 10), "no caching, first")
    assert_tokens(second.token_ids, tiny.expected(prompt, 10), "no caching, repeated")
    assert engine.pool.stats().blocks_cached == 0


def test_unbounded_max_tokens_stops_at_the_context_length(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(9), 20)
    engine = make_engine(tiny.loaded, num_blocks=8, max_model_len=48)

    out = run_checked(engine, {"r": (prompt, SamplingParams(max_tokens=None, **NO_EOS))})["r"]

    assert out.finish_reason == "length"
    assert_tokens(out.token_ids, tiny.expected(prompt, 28), "20-token prompt, context 48")


@pytest.mark.parametrize("decode_kernel", [True, False], ids=["in-place-kernel", "gather-sdpa"])
def test_decode_batch_of_mixed_lengths_crossing_block_edges_is_exact(
    tiny: TinyModel, decode_kernel: bool
) -> None:
    """One decode batch whose contexts end just before, at and after block edges (16, 32, 48):
    the CPU kernel must stop each row at its own length, and the padded K/V gather mask it there,
    whatever its neighbours."""
    rng = random.Random(7)
    lengths = [1, 14, 15, 16, 17, 31, 32, 33, 47, 5]
    prompts = {f"m{i}": random_prompt(rng, n) for i, n in enumerate(lengths)}
    params = SamplingParams(max_tokens=6, **NO_EOS)
    engine = make_engine(tiny.loaded, num_blocks=64, decode_kernel=decode_kernel)
    assert engine.executor.runner.decode_kernel is (decode_kernel and kernel.available())

    outs = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})

    for rid, prompt in prompts.items():
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 6), f"{rid}, {len(prompt)} tokens")
    assert engine.stats().max_batch_seqs == len(lengths)


def test_decode_buckets_of_short_and_long_contexts_are_exact(tiny: TinyModel) -> None:
    """Decodes at ~8, ~40 and ~150 tokens of context, some of equal length (a bucket with no
    padding mask): each context-length bucket gathers K/V to its own longest, rows sorted by
    context, and every sequence stays exact whatever bucket and row it lands in."""
    rng = random.Random(8)
    lengths = [150, 7, 40, 151, 8, 41, 40, 150, 3, 100]
    prompts = {f"b{i}": random_prompt(rng, n) for i, n in enumerate(lengths)}
    params = SamplingParams(max_tokens=8, **NO_EOS)
    engine = make_engine(tiny.loaded, num_blocks=128, decode_kernel=False)  # the gather + SDPA path
    buckets: list[list[int]] = []
    build = engine.executor.runner._decode_buckets

    def spy(singles: list[Any], first_row: int) -> Any:
        out = build(singles, first_row)
        buckets.append([b.blocks.shape[1] * engine.executor.runner.block_size for b in out])
        return out

    engine.executor.runner._decode_buckets = spy  # type: ignore[method-assign]
    outs = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})

    for rid, prompt in prompts.items():
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 8), f"{rid}, {len(prompt)} tokens")
    # 150/151/100 | 40/41/40 | 7/8/3 (plus the new token), gathered in whole 16-slot blocks: 3 needs
    # no bucket of its own, it takes as many blocks as 8.
    assert [160, 48, 16] in buckets, buckets
