"""Poison isolation: a request whose sampling or detokenising fails is failed alone; the six
streaming requests batched with it finish token-exact, and no block leaks."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import torch

from broker.errors import InvalidRequestError
from broker.sampling import SEED_MAX, SamplingParams
from tests.workers._helpers import TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.errors import RequestFailedError
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.request import GenerationRequest
from workers.loop.engine_loop import EngineLoop
from workers.loop.handle import RequestHandle

MAX_TOKENS = 12
SEEDED = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=7, ignore_eos=True)


def _prompts() -> list[list[int]]:
    rng = random.Random(70)
    return [random_prompt(rng, 9 + 6 * i) for i in range(6)]


def _unchecked(**fields: Any) -> SamplingParams:
    """A SamplingParams holding values its constructor refuses (as a hand-built message could)."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, ignore_eos=True)
    for name, value in fields.items():
        msgspec.structs.force_setattr(params, name, value)
    return params


def _run_with_poison(
    tiny: TinyModel, poison: SamplingParams, patch: Callable[[LLMEngine], None] | None = None
) -> tuple[RequestHandle, list[list[int]], list[int]]:
    """Six greedy streams, one seeded stream and the poison, all queued before the loop starts
    so that they share the first step. Checks the six and the pool; returns the poison's handle."""
    prompts = _prompts()
    engine = make_engine(tiny.loaded, num_blocks=64)
    if patch is not None:
        patch(engine)
    loop = EngineLoop(engine)
    handles = [
        loop.submit(GenerationRequest.new(p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)))
        for p in prompts[:3]
    ]
    bad = loop.submit(GenerationRequest.new(prompts[0][:5], poison, request_id="poison"))
    handles += [
        loop.submit(GenerationRequest.new(p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)))
        for p in prompts[3:]
    ]
    seeded = loop.submit(GenerationRequest.new(prompts[2], SEEDED))
    with loop:
        streams = [[t for out in h for t in out.delta_token_ids] for h in handles]
        finals = [h.result(timeout=60) for h in handles]
        seeded_tokens = list(seeded.result(timeout=60).token_ids)
        with pytest.raises(InvalidRequestError):
            bad.result(timeout=30)
        loop.call(lambda e: e.check_integrity())
        stats = loop.call(lambda e: e.stats())
        assert loop.healthy and loop.restarts == 0
    assert stats.pool.blocks_used == 0, f"blocks leaked: {stats.pool}"
    for prompt, stream, final in zip(prompts, streams, finals, strict=True):
        assert_tokens(final.token_ids, tiny.expected(prompt, MAX_TOKENS), f"{len(prompt)}-token neighbour")
        assert stream == list(final.token_ids)
        assert final.finish_reason == "length"
    return bad, prompts, seeded_tokens


def _seeded_alone(tiny: TinyModel, prompt: list[int]) -> list[int]:
    return list(make_engine(tiny.loaded, num_blocks=64).generate([prompt], SEEDED)[0].token_ids)


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"), ({"temperature": 1e-300}, "temperature")],
    ids=["seed=2**64", "seed=-1", "temperature=1e-300"],
)
def test_add_request_refuses_poison_that_skipped_the_constructor(
    tiny: TinyModel, fields: dict[str, Any], param: str
) -> None:
    bad, _, _ = _run_with_poison(tiny, _unchecked(**fields))
    with pytest.raises(InvalidRequestError) as info:
        bad.result(timeout=1)
    assert info.value.param == param


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [({"seed": 2**64}, "seed", "out of range"), ({"temperature": 1e-300}, "temperature", "overflow")],
    ids=["seed=2**64", "temperature=1e-300"],
)
def test_poison_reaching_the_step_fails_alone(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], param: str, says: str
) -> None:
    """add_request's own check switched off: the sampler meets the poison mid-step."""
    monkeypatch.setattr(SamplingParams, "check", lambda self: None)
    bad, prompts, seeded = _run_with_poison(tiny, _unchecked(**fields))
    with pytest.raises(InvalidRequestError, match=says) as info:
        list(bad)  # the stream raises too
    assert info.value.param == param
    assert_tokens(seeded, _seeded_alone(tiny, prompts[2]), "seeded neighbour vs alone")


def test_detokenizer_failure_fails_only_its_request(tiny: TinyModel) -> None:
    def patch(engine: LLMEngine) -> None:
        update = engine.post.detokenizer.update

        def flaky(seq: Any, stop_token: bool = False) -> str | None:
            if seq.request_id == "poison" and len(seq.output_token_ids) == 3:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
            return update(seq, stop_token)

        engine.post.detokenizer.update = flaky  # type: ignore[method-assign]

    bad, _, _ = _run_with_poison(tiny, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), patch)
    with pytest.raises(RequestFailedError) as info:
        bad.result(timeout=1)
    assert info.value.param == "detokenize"
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


def test_batched_sampling_failure_falls_back_row_by_row(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the batched part of sampling raises, rows are sampled one by one: seeds stay exact."""

    def patch(engine: LLMEngine) -> None:
        sample = engine.executor.sampler.sample

        def batch_breaks(logits: torch.Tensor, requests: list[Any]) -> list[Any]:
            if len(requests) > 1:
                raise RuntimeError("injected batch failure")
            return sample(logits, requests)

        engine.executor.sampler.sample = batch_breaks  # type: ignore[method-assign]

    monkeypatch.setattr(SamplingParams, "check", lambda self: None)
    bad, prompts, seeded = _run_with_poison(tiny, _unchecked(seed=2**64), patch)
    with pytest.raises(InvalidRequestError, match="seed"):
        bad.result(timeout=1)
    assert_tokens(seeded, _seeded_alone(tiny, prompts[2]), "seeded neighbour vs alone")


def test_engine_marks_the_poison_error_and_keeps_its_invariants(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stepped by hand, with the pool checked after every step."""
    monkeypatch.setattr(SamplingParams, "check", lambda self: None)
    prompts = _prompts()
    engine = make_engine(tiny.loaded, num_blocks=64)
    greedy = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    requests = {f"r{i}": (p, greedy) for i, p in enumerate(prompts)}
    requests["poison"] = (prompts[5], _unchecked(temperature=1e-300))
    done = run_checked(engine, requests)
    assert done["poison"].finish_reason == "error" and "temperature" in (done["poison"].error or "")
    for i, prompt in enumerate(prompts):
        assert_tokens(done[f"r{i}"].token_ids, tiny.expected(prompt, MAX_TOKENS), f"r{i}")


def test_the_largest_seed_is_accepted(tiny: TinyModel) -> None:
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=SEED_MAX, ignore_eos=True)
    out = make_engine(tiny.loaded, num_blocks=16).generate([[1, 2, 3]], params)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4
