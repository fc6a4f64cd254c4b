"""Sampling: seeds reproduce, degenerate sampling equals greedy, stop strings and EOS end requests."""

from __future__ import annotations

import random

import pytest

from broker.sampling import SamplingParams
from tests.workers._helpers import (
    NO_EOS,
    Reference,
    TinyModel,
    assert_tokens,
    chat_prompt,
    make_engine,
    random_prompt,
    run_checked,
)
from workers.engine.model.loader import LoadedModel


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [random_prompt(rng, n) for n in (6, 25, 47)]


def test_seeded_sampling_reproduces_across_engines(tiny: TinyModel) -> None:
    prompts = _prompts(30)
    params = [SamplingParams(max_tokens=24, temperature=1.5, top_p=0.9, seed=s, **NO_EOS) for s in (1, 2, 3)]

    first = make_engine(tiny.loaded, num_blocks=32).generate(prompts, params)
    second = make_engine(tiny.loaded, num_blocks=32).generate(prompts, params)

    for a, b, prompt in zip(first, second, prompts, strict=True):
        assert_tokens(b.token_ids, a.token_ids, f"seeded, {len(prompt)} tokens, second engine")
    greedy = [tiny.expected(p, 24) for p in prompts]
    assert [list(o.token_ids) for o in first] != greedy, "temperature 1.5 never left the greedy path"


def test_seed_is_per_request_not_per_batch(tiny: TinyModel) -> None:
    """A seeded request draws the same tokens alone or batched with unseeded neighbours."""
    prompts = _prompts(31)
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=7, **NO_EOS)
    noisy = SamplingParams(max_tokens=16, temperature=1.0, **NO_EOS)

    alone = make_engine(tiny.loaded, num_blocks=32).generate([prompts[1]], seeded)[0]
    batched = make_engine(tiny.loaded, num_blocks=32).generate(prompts, [noisy, seeded, noisy])[1]

    assert_tokens(batched.token_ids, alone.token_ids, "seed 7, alone vs batched")


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=16, temperature=0.7, top_k=1, **NO_EOS),
        SamplingParams(max_tokens=16, temperature=1.0, top_p=1e-6, seed=3, **NO_EOS),
    ],
    ids=["top_k=1", "top_p=1e-6"],
)
def test_sampling_restricted_to_one_token_equals_greedy(tiny: TinyModel, params: SamplingParams) -> None:
    prompts = _prompts(32)
    greedy_neighbour = SamplingParams(max_tokens=16, **NO_EOS)
    engine = make_engine(tiny.loaded, num_blocks=32)

    outs = engine.generate([*prompts, prompts[0]], [params, params, params, greedy_neighbour])

    for out, prompt in zip(outs, [*prompts, prompts[0]], strict=True):
        assert_tokens(out.token_ids, tiny.expected(prompt, 16), f"{len(prompt)} tokens")


@pytest.mark.smollm2
def test_stop_string_cuts_the_text_before_it(smollm2: LoadedModel) -> None:
    prompt = chat_prompt(smollm2.tokenizer, "Describe the sea in three sentences.")
    engine = make_engine(smollm2, num_blocks=32)
    greedy = engine.generate([prompt], SamplingParams(max_tokens=24))[0]
    words = greedy.text.split()
    assert len(words) >= 6, f"too short a greedy answer to cut: {greedy.text!r}"
    stop = " " + words[len(words) // 2]  # its first occurrence decides the cut
    cut = greedy.text.index(stop)

    out = engine.generate([prompt], SamplingParams(max_tokens=24, stop=(stop,)))[0]

    assert out.finish_reason == "stop"
    assert out.text == greedy.text[:cut], f"stop {stop!r} in {greedy.text!r}"
    assert list(out.token_ids) == list(greedy.token_ids[: len(out.token_ids)])
    assert len(out.token_ids) < len(greedy.token_ids)
    engine.check_integrity()


@pytest.mark.smollm2
def test_eos_finishes_with_stop(smollm2: LoadedModel, smollm2_reference: Reference) -> None:
    prompt = chat_prompt(smollm2.tokenizer, "What is the capital of France?")
    engine = make_engine(smollm2, num_blocks=32)

    out = engine.generate([prompt], SamplingParams(max_tokens=64))[0]

    assert out.finish_reason == "stop", f"no EOS within 64 tokens: {out.text!r}"
    assert out.token_ids[-1] in smollm2.eos_token_ids
    assert "Paris" in out.text and "<|im_end|>" not in out.text
    assert_tokens(out.token_ids, smollm2_reference.greedy(prompt, 64), "capital of France")
    engine.check_integrity()


@pytest.mark.smollm2
def test_ignore_eos_runs_to_max_tokens(smollm2: LoadedModel) -> None:
    prompt = chat_prompt(smollm2.tokenizer, "What is the capital of France?")
    engine = make_engine(smollm2, num_blocks=32)

    out = run_checked(engine, {"r": (prompt, SamplingParams(max_tokens=40, ignore_eos=True))})["r"]

    assert out.finish_reason == "length" and len(out.token_ids) == 40


def test_unseeded_rows_drawn_together_follow_each_rows_distribution() -> None:
    """Plain temperature rows are drawn together (one inverse-CDF draw): each row follows its own
    softmax(logits / T), a row whose temperature overflows fails alone, and seeded, top-k and
    greedy rows in the same batch are untouched by the batched draw."""
    import torch

    from broker.errors import InvalidRequestError
    from workers.engine.requests.sequence import EngineRequest
    from workers.engine.sampling.sampler import Sampler

    vocab, n = 64, 600
    logits = torch.full((n + 3, vocab), -30.0)
    logits[:n:2, 3], logits[:n:2, 5] = 0.0, -1.0  # even rows: p(3) = 1 / (1 + e^-1) = 0.73 at T=1
    logits[1:n:2, 7] = 0.0  # odd rows: token 7 alone
    logits[n:, 9] = 1.0
    t1 = SamplingParams(temperature=1.0)
    requests = [(f"r{i}", t1) for i in range(n)]
    logits[10, 3] = 3e38  # /T overflows to inf: softmax gives NaN
    requests[10] = ("hot", SamplingParams(temperature=0.5))
    requests += [
        ("seeded", SamplingParams(temperature=1.0, seed=5)),
        ("topk", SamplingParams(temperature=1.0, top_k=1)),
        ("greedy", SamplingParams(temperature=0.0)),
    ]
    seqs = [EngineRequest(rid, [0], params, 16) for rid, params in requests]
    out = Sampler(torch.device("cpu")).sample(logits, seqs)

    assert isinstance(out[10], InvalidRequestError) and out[10].param == "temperature"
    even = [out[i] for i in range(0, n, 2) if i != 10]
    assert set(even) <= {3, 5}
    share = even.count(3) / len(even)
    assert 0.63 < share < 0.83, share  # 0.73 +- ~5 sigma over 299 draws
    assert all(out[i] == 7 for i in range(1, n, 2))
    assert out[n:] == [9, 9, 9]


def test_the_batched_draw_follows_each_distribution_and_never_draws_a_zero() -> None:
    """The inverse-CDF draw: zero-probability tokens (first, inner and last) never come out, the
    others at their probability, rows of different distributions in one call."""
    import torch

    from workers.engine.sampling.sampler import _inverse_cdf

    n = 20000
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.2, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]]).repeat(n, 1)
    tokens = _inverse_cdf(probs)
    first = torch.bincount(tokens[0::2], minlength=6) / n
    assert first[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(
        first[[1, 3, 4]], torch.tensor([0.5, 0.2, 0.3]), atol=0.02, rtol=0
    )  # ~5.7 sigma
    assert bool((tokens[1::2] == 5).all())
