"""A redelivered job resumes after the tokens its stream holds; when those already complete it (its
worker died after the last token, before the result), it finishes at once without computing."""

from __future__ import annotations

import random

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, make_engine, random_prompt, run_checked


def _resume(
    tiny: TinyModel, prompt: list[int], params: SamplingParams, done: list[int]
) -> tuple[list[int], str]:
    engine = make_engine(tiny.loaded, 32)
    engine.add_request("r", prompt, params, output_token_ids=list(done))
    out = run_checked(engine)["r"]
    return list(out.token_ids), out.finish_reason or ""


def test_resume_midway_is_exact(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(1), 40)
    expected = tiny.expected(prompt, 12)
    tokens, reason = _resume(tiny, prompt, SamplingParams(max_tokens=12, **NO_EOS), expected[:5])
    assert tokens == expected and reason == "length"


def test_resume_of_a_complete_output_finishes_without_a_step(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(2), 40)
    expected = tiny.expected(prompt, 8)
    engine = make_engine(tiny.loaded, 32)
    engine.add_request("r", prompt, SamplingParams(max_tokens=8, **NO_EOS), output_token_ids=expected)
    outs = run_checked(engine)
    assert list(outs["r"].token_ids) == expected and outs["r"].finish_reason == "length"
    assert engine.counters.num_steps == 0


def test_resume_after_an_eos_token_stops_there(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(3), 40)
    expected = tiny.expected(prompt, 6)
    engine = make_engine(tiny.loaded, 32)
    eos = next(iter(tiny.loaded.eos_token_ids), None)
    params = SamplingParams(max_tokens=20)
    if eos is None:  # the tiny model has no EOS: a stop string stands in
        text = tiny.loaded.tokenizer.decode(expected)
        params = SamplingParams(max_tokens=20, stop=(text[-2:],), **NO_EOS) if len(text) >= 2 else params
    else:
        expected = [*expected, eos]
    engine.add_request("r", prompt, params, output_token_ids=expected)
    outs = run_checked(engine)
    assert outs["r"].finish_reason == "stop" and engine.counters.num_steps == 0


def test_aborting_a_complete_resume_returns_it(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(4), 20)
    expected = tiny.expected(prompt, 4)
    engine = make_engine(tiny.loaded, 32)
    engine.add_request("r", prompt, SamplingParams(max_tokens=4, **NO_EOS), output_token_ids=expected)
    out = engine.abort_request("r")
    assert out is not None and out.finished and not engine.has_unfinished()
