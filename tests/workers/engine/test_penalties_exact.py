"""Greedy outputs with penalties, logit_bias, min_tokens and stop_token_ids are token-exact with
HF `generate` run with the same processors, batched beside requests that use none (exact too),
and after a resume."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from broker.errors import InvalidRequestError
from broker.sampling import SamplingParams
from tests.workers._helpers import (
    NO_EOS,
    VOCAB,
    TinyModel,
    assert_tokens,
    make_engine,
    random_prompt,
    run_checked,
)
from workers.engine.requests.request import GenerationRequest

N = 16


class _OpenAIPenalties(LogitsProcessor):
    """frequency_penalty and presence_penalty over the generated tokens (HF has none): the formula."""

    def __init__(self, prompt_length: int, frequency: float, presence: float) -> None:
        self.prompt_length, self.frequency, self.presence = prompt_length, frequency, presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = input_ids[:, self.prompt_length :]
        counts = torch.zeros_like(scores).scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
        if self.frequency:
            scores = scores - torch.tensor(self.frequency) * counts
        if self.presence:
            scores = scores - torch.tensor(self.presence) * (counts > 0)
        return scores  # type: ignore[return-value]


@torch.inference_mode()
def _hf(tiny: TinyModel, prompt: list[int], params: SamplingParams) -> list[int]:
    """HF `generate`, greedy at batch 1, with the processors equivalent to params."""
    kwargs: dict[str, Any] = {}
    if params.repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = params.repetition_penalty
    if params.logit_bias:
        kwargs["sequence_bias"] = {(t,): float(b) for t, b in params.logit_bias}
    if params.stop_token_ids:
        kwargs["eos_token_id"] = list(params.stop_token_ids)
        kwargs["min_new_tokens"] = params.min_tokens
    if params.frequency_penalty or params.presence_penalty:
        penalties = _OpenAIPenalties(len(prompt), params.frequency_penalty, params.presence_penalty)
        kwargs["logits_processor"] = LogitsProcessorList([penalties])
    ids = torch.tensor([prompt])
    out = tiny.reference.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=params.max_tokens,
        do_sample=False,
        pad_token_id=0,
        **kwargs,
    )
    return list(out[0, len(prompt) :].tolist())


def _cases(tiny: TinyModel) -> dict[str, tuple[list[int], SamplingParams]]:
    rng = random.Random(40)
    prompts = [random_prompt(rng, n) for n in (9, 30, 17, 45, 22, 12, 5, 28, 14)]
    greedy = [tiny.expected(p, N) for p in prompts]

    def params(**fields: Any) -> SamplingParams:
        return SamplingParams(max_tokens=N, **NO_EOS, **fields)

    # min_tokens holds greedy[5][2] back; `late`, a token of the path that takes instead, ends it
    held = _hf(tiny, prompts[5], params(min_tokens=8, stop_token_ids=(greedy[5][2],)))
    late = held[10]
    assert late not in held[:10]
    # The tiny model's logits are far apart: a penalty under 2 changes its greedy output only
    # where that output repeats a token, as prompts[4]'s does.
    return {
        "plain": (prompts[0], params()),
        "repetition 1.5": (prompts[4], params(repetition_penalty=1.5)),
        "repetition 0.5": (prompts[2], params(repetition_penalty=0.5)),
        "logit_bias": (
            prompts[3],
            params(logit_bias=((greedy[3][0], -100.0), (greedy[3][3], -4.0), (1234, 3.0))),
        ),
        "stop token": (prompts[1], params(stop_token_ids=(greedy[1][5], 77))),
        "min_tokens": (prompts[5], params(min_tokens=8, stop_token_ids=(greedy[5][2], late))),
        "frequency, presence": (prompts[4], params(frequency_penalty=1.5, presence_penalty=-1.0)),
        "everything": (
            prompts[7],
            params(
                repetition_penalty=1.3,
                logit_bias=((greedy[7][1], -6.0),),
                frequency_penalty=0.8,
                presence_penalty=-0.4,
                min_tokens=4,
                stop_token_ids=(greedy[7][2],),
            ),
        ),
        "plain too": (prompts[8], params()),
    }


def test_processed_greedy_outputs_equal_hf_generate_in_one_batch(tiny: TinyModel) -> None:
    cases = _cases(tiny)
    engine = make_engine(tiny.loaded, num_blocks=64)

    outs = run_checked(engine, cases)

    assert engine.stats().max_batch_seqs == len(cases)
    for name, (prompt, params) in cases.items():
        want = _hf(tiny, prompt, params)
        assert_tokens(outs[name].token_ids, want, name)
        if not name.startswith("plain"):
            assert want != tiny.expected(prompt, N), f"{name} left the greedy output as it was"
    for name in ("stop token", "min_tokens"):
        out = outs[name]
        assert out.finish_reason == "stop" and out.token_ids[-1] in cases[name][1].stop_token_ids, name
    prompt, params = cases["min_tokens"]
    assert tiny.expected(prompt, N)[2] in params.stop_token_ids  # it would have ended at 3 tokens
    assert len(outs["min_tokens"].token_ids) == 11


@pytest.mark.parametrize("name", ["repetition 1.5", "frequency, presence", "min_tokens", "everything"])
def test_a_resumed_request_is_processed_over_its_restored_output(tiny: TinyModel, name: str) -> None:
    """Resumed right where the processors first change the greedy path: the earlier token that
    the penalties count, or the output min_tokens counts, is all in the restored output."""
    prompt, params = _cases(tiny)[name]
    whole, greedy = _hf(tiny, prompt, params), tiny.expected(prompt, N)
    at = next(i for i, (a, b) in enumerate(zip(whole, greedy, strict=False)) if a != b)
    if name == "min_tokens":
        at = 5  # before min_tokens: the rest of the hold-back counts the restored tokens
    assert at > 0
    engine = make_engine(tiny.loaded, 32)

    engine.add_request(GenerationRequest("r", prompt, params, output_token_ids=whole[:at]))
    out = run_checked(engine)["r"]

    assert_tokens(out.token_ids, whole, f"{name}, resumed after {at} tokens")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": ((VOCAB, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((5, 1.0), (VOCAB + 9, -1.0))}, "logit_bias"),
        ({"stop_token_ids": (3, VOCAB)}, "stop_token_ids"),
    ],
    ids=["bias", "second bias", "stop token"],
)
def test_token_ids_outside_the_vocabulary_are_refused(
    tiny: TinyModel, fields: dict[str, Any], param: str
) -> None:
    engine = make_engine(tiny.loaded, num_blocks=8)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(GenerationRequest("r", [1, 2, 3], SamplingParams(max_tokens=4, **fields)))
    assert info.value.param == param and not engine.has_unfinished()
