"""Logprobs of sampled and prompt tokens equal an HF forward of the same ids (raw logits, fp32,
|delta| <= 1e-4), however the prompt was chunked, batched or cached before; greedy tokens stay
exact with them on."""

from __future__ import annotations

import random

import pytest
import torch

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.requests.logprob import Logprob
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest

TOL = 1e-4


@torch.inference_mode()
def _hf_logprobs(tiny: TinyModel, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row i is the log-softmax that predicts ids[i + 1]."""
    logits = tiny.reference.model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def _check(entries: list[Logprob], ref: torch.Tensor, first: int, ids: list[int], k: int) -> None:
    """entries[j] is ids[first + j]'s logprob, predicted by ref row first + j - 1."""
    for j, entry in enumerate(entries):
        row = ref[first + j - 1]
        assert entry.token_id == ids[first + j]
        assert entry.logprob is not None and abs(entry.logprob - float(row[entry.token_id])) <= TOL, (
            first,
            j,
        )
        assert len(entry.top) == k
        if k:
            want = row.topk(k)
            assert [t for t, _ in entry.top] == want.indices.tolist()
            assert max(abs(v - w) for (_, v), w in zip(entry.top, want.values.tolist(), strict=True)) <= TOL


def _streamed(outs: list[RequestOutput]) -> tuple[list[Logprob], tuple[Logprob, ...]]:
    deltas = [lp for out in outs for lp in out.delta_logprobs]
    prompts = [out.prompt_logprobs for out in outs if out.prompt_logprobs]
    assert len(prompts) <= 1, "prompt logprobs are sent once"
    return deltas, prompts[0] if prompts else ()


@pytest.mark.parametrize("budget", [512, 20])
def test_prompt_and_output_logprobs_equal_an_hf_forward(tiny: TinyModel, budget: int) -> None:
    rng = random.Random(5)
    shared = random_prompt(rng, 40)
    prompt = shared + random_prompt(rng, 13)
    other = random_prompt(rng, 30)
    engine = make_engine(tiny.loaded, num_blocks=64, max_num_batched_tokens=budget)
    # The shared prefix is cached before: a prompt-logprobs request must compute it all the same.
    run_checked(engine, {"warm": ([*shared, 7], SamplingParams(max_tokens=2, **NO_EOS))})
    computed = engine.stats().prompt_tokens_computed

    asks = SamplingParams(max_tokens=6, logprobs=3, prompt_logprobs=2, **NO_EOS)
    engine.add_request(GenerationRequest("asks", prompt, asks))
    engine.add_request(GenerationRequest("plain", other, SamplingParams(max_tokens=6, **NO_EOS)))
    outs: dict[str, list[RequestOutput]] = {"asks": [], "plain": []}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].append(out)
        engine.check_integrity()

    final = outs["asks"][-1]
    assert_tokens(final.token_ids, tiny.expected(prompt, 6), "with logprobs")
    assert_tokens(outs["plain"][-1].token_ids, tiny.expected(other, 6), "its batch-mate")
    assert not any(o.delta_logprobs or o.prompt_logprobs for o in outs["plain"])
    output_lps, prompt_lps = _streamed(outs["asks"])
    ids = prompt + list(final.token_ids)
    ref = _hf_logprobs(tiny, ids)
    assert len(prompt_lps) == len(prompt) - 1 and len(output_lps) == 6
    _check(list(prompt_lps), ref, 1, ids, 2)
    _check(output_lps, ref, len(prompt), ids, 3)
    assert engine.stats().prompt_tokens_computed - computed == len(prompt) + len(other), "no prefix hit"
    assert engine.pool.stats().blocks_used == 0


def test_echo_without_output_computes_the_prompt_alone(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(6), 21)
    engine = make_engine(tiny.loaded, num_blocks=16)

    out = run_checked(engine, {"echo": (prompt, SamplingParams(max_tokens=0, prompt_logprobs=0))})["echo"]

    assert out.finish_reason == "length" and out.token_ids == ()
    assert len(out.prompt_logprobs) == 20
    _check(list(out.prompt_logprobs), _hf_logprobs(tiny, prompt), 1, prompt, 0)


def test_logprobs_of_a_sampled_token_are_of_the_raw_logits(tiny: TinyModel) -> None:
    """Temperature changes what is drawn, not the logprobs reported (vLLM's raw logprobs)."""
    prompt = random_prompt(random.Random(8), 9)
    engine = make_engine(tiny.loaded, num_blocks=16)
    params = SamplingParams(max_tokens=4, temperature=0.7, seed=3, logprobs=1, **NO_EOS)

    outs: list[RequestOutput] = []
    engine.add_request(GenerationRequest("t", prompt, params))
    while engine.has_unfinished():
        outs.extend(engine.step())

    ids = prompt + list(outs[-1].token_ids)
    _check([lp for o in outs for lp in o.delta_logprobs], _hf_logprobs(tiny, ids), len(prompt), ids, 1)


def test_a_resumed_request_gives_the_logprobs_an_uninterrupted_one_gives(tiny: TinyModel) -> None:
    """A redelivered job resumes after the tokens its stream holds: the logprobs of the tokens it
    adds, and its prompt's, are those of a run that was never interrupted."""
    prompt = random_prompt(random.Random(9), 30)
    params = SamplingParams(max_tokens=8, logprobs=2, prompt_logprobs=1, **NO_EOS)
    whole_engine = make_engine(tiny.loaded, num_blocks=16)
    whole: list[RequestOutput] = []
    whole_engine.add_request(GenerationRequest("w", prompt, params))
    while whole_engine.has_unfinished():
        whole.extend(whole_engine.step())
    output_lps, prompt_lps = _streamed(whole)

    engine = make_engine(tiny.loaded, num_blocks=16)
    resumed: list[RequestOutput] = []
    engine.add_request(GenerationRequest("r", prompt, params, output_token_ids=list(whole[-1].token_ids[:3])))
    while engine.has_unfinished():
        resumed.extend(engine.step())
    again, prompt_again = _streamed(resumed)

    assert resumed[-1].token_ids == whole[-1].token_ids
    assert [e.token_id for e in again] == [e.token_id for e in output_lps[3:]]
    for got, want in zip([*again, *prompt_again], [*output_lps[3:], *prompt_lps], strict=True):
        assert got.logprob is not None and want.logprob is not None
        assert abs(got.logprob - want.logprob) <= TOL
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
