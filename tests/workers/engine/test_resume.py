"""A redelivered job resumes after the tokens its stream holds; when those already complete it (its
worker died after the last token, before the result), it finishes at once without computing."""

from __future__ import annotations

import random

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, make_engine, random_prompt, run_checked
from workers.engine.requests.request import GenerationRequest


def _resume(
    tiny: TinyModel, prompt: list[int], params: SamplingParams, done: list[int]
) -> tuple[list[int], str]:
    engine = make_engine(tiny.loaded, 32)
    engine.add_request(GenerationRequest("r", prompt, params, output_token_ids=list(done)))
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
    engine.add_request(
        GenerationRequest("r", prompt, SamplingParams(max_tokens=8, **NO_EOS), output_token_ids=expected)
    )
    outs = run_checked(engine)
    assert list(outs["r"].token_ids) == expected and outs["r"].finish_reason == "length"
    assert engine.report.counters.num_steps == 0


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
    engine.add_request(GenerationRequest("r", prompt, params, output_token_ids=expected))
    outs = run_checked(engine)
    assert outs["r"].finish_reason == "stop" and engine.report.counters.num_steps == 0


def test_aborting_a_complete_resume_returns_it(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(4), 20)
    expected = tiny.expected(prompt, 4)
    engine = make_engine(tiny.loaded, 32)
    engine.add_request(
        GenerationRequest("r", prompt, SamplingParams(max_tokens=4, **NO_EOS), output_token_ids=expected)
    )
    out = engine.abort_request("r")
    assert out is not None and out.finished and not engine.has_unfinished()


def test_resume_whose_cached_prefix_reaches_past_the_prompt_is_exact(tiny: TinyModel) -> None:
    """A copy resumed on the worker that ran the first attempt: the pool still holds full blocks
    of the earlier output, so its prefix hit covers more tokens than its prompt has. That must be
    an ordinary hit (it once failed the step, and every request in it)."""
    prompt = random_prompt(random.Random(5), 40)
    expected = tiny.expected(prompt, 14)
    params = SamplingParams(max_tokens=14, **NO_EOS)
    engine = make_engine(tiny.loaded, 32)
    assert list(run_checked(engine, {"first": (prompt, params)})["first"].token_ids) == expected
    engine.add_request(GenerationRequest("again", prompt, params, output_token_ids=expected[:10]))
    other = random_prompt(random.Random(6), 30)
    outs = run_checked(engine, {"mate": (other, params)})
    assert list(outs["again"].token_ids) == expected and outs["again"].finish_reason == "length"
    assert list(outs["mate"].token_ids) == tiny.expected(other, 14)
    assert outs["again"].cached_tokens == len(prompt)  # capped at the prompt: the rest is output
    stats = engine.pool.stats()
    assert stats.prefix_cache_hits_tokens <= stats.prefix_cache_queries_tokens


def test_resume_inside_a_character_streams_on_from_where_the_client_is(tiny: TinyModel) -> None:
    """The stream held a token that ends in half a UTF-8 character (its text not yet sent): the
    resumed copy must send on after the characters the client has, not the whole answer again."""
    tok = tiny.loaded.tokenizer
    head = tok("Hi there", add_special_tokens=False)["input_ids"]
    half = tok("😀", add_special_tokens=False)["input_ids"][:1]  # decodes to U+FFFD alone
    done = [*head, *half]
    sent = tok.decode(head)
    assert tok.decode(done).endswith("\ufffd") and not sent.endswith("\ufffd")
    prompt = random_prompt(random.Random(7), 30)
    engine = make_engine(tiny.loaded, 32)
    params = SamplingParams(max_tokens=len(done) + 6, **NO_EOS)
    engine.add_request(
        GenerationRequest("r", prompt, params, output_token_ids=done, streamed_chars=len(sent))
    )
    streamed = sent
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            assert out.text_start == len(streamed) and out.token_start == len(out.token_ids) - len(
                out.delta_token_ids
            )
            streamed += out.delta_text
            final = out
    assert final is not None and final.finished
    assert list(final.token_ids[: len(done)]) == done
    assert streamed == final.text, (streamed, final.text)
