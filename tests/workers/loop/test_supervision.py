"""EngineLoop supervision: a failed step fails what is in flight (retryable) and the loop goes on;
a dead loop thread is unhealthy and refuses work at once; latest_stats never waits on a step."""

from __future__ import annotations

import random
import time

import pytest

from broker.errors import KvferryError
from broker.sampling import SamplingParams
from tests.workers._helpers import TinyModel, assert_tokens, make_engine, random_prompt
from workers.engine.errors import EngineFailedError
from workers.engine.requests.request import GenerationRequest
from workers.loop.driver import MAX_FAILED_STEPS_IN_ROW
from workers.loop.engine_loop import STATS_IDLE_S, EngineLoop

MAX_TOKENS = 10


def _prompts(seed: int, n: int = 4) -> list[list[int]]:
    rng = random.Random(seed)
    return [random_prompt(rng, 20 + 9 * i) for i in range(n)]  # 20..47 tokens: 2-3 blocks each


def _wait(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def test_a_crashed_step_fails_in_flight_requests_and_the_loop_goes_on(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=64, debug_crash_step=3)
    prompts = _prompts(80)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    loop = EngineLoop(engine)
    doomed = [loop.submit(GenerationRequest.new(p, params)) for p in prompts]
    with loop:
        for handle in doomed:
            with pytest.raises(EngineFailedError, match="crashes on purpose") as info:
                list(handle)  # two deltas, then the stream raises
            assert isinstance(info.value, KvferryError) and info.value.retryable
            assert isinstance(info.value.__cause__, RuntimeError)
        assert loop.healthy and loop.restarts == 1
        assert loop.call(lambda e: e.pool.stats().blocks_used) == 0
        loop.call(lambda e: e.check_integrity())

        # The redelivered copies and fresh requests both run exact on the same loop.
        again = [loop.submit(GenerationRequest.new(p, params)) for p in [*prompts, *_prompts(81)]]
        for handle, prompt in zip(again, [*prompts, *_prompts(81)], strict=True):
            assert_tokens(handle.result(timeout=60).token_ids, tiny.expected(prompt, MAX_TOKENS), "after")
        assert loop.healthy and loop.restarts == 1
        loop.call(lambda e: e.check_integrity())
        assert loop.call(lambda e: e.pool.stats().blocks_used) == 0


def test_a_dead_loop_thread_is_unhealthy_and_fails_fast(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=64, debug_crash_step=2)

    def broken_recovery() -> list[str]:
        raise RuntimeError("recovery is broken too")

    engine.abort_all = broken_recovery  # type: ignore[method-assign]
    loop = EngineLoop(engine).start()
    try:
        in_flight = loop.submit(
            GenerationRequest.new(_prompts(82)[0], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        )
        with pytest.raises(EngineFailedError, match="died"):
            in_flight.result(timeout=30)
        _wait(lambda: not loop.healthy)
        assert isinstance(loop.failure, RuntimeError)
        started = time.monotonic()
        with pytest.raises(EngineFailedError, match="recovery is broken"):
            loop.submit(GenerationRequest.new([1, 2, 3], SamplingParams(max_tokens=2))).result(timeout=5)
        with pytest.raises(EngineFailedError):
            loop.call(lambda e: e.stats(), timeout=5)
        assert time.monotonic() - started < 0.5, "a dead loop must refuse work at once"
    finally:
        loop.stop()


def test_a_loop_whose_every_step_fails_gives_up(tiny: TinyModel) -> None:
    """A broken device fails every step: after a few in a row the loop dies rather than churn."""
    engine = make_engine(tiny.loaded, num_blocks=64)

    def always(scheduled: object) -> None:
        raise RuntimeError("the device is gone")

    engine.report.faults.on_step = always  # type: ignore[method-assign]
    loop = EngineLoop(engine).start()
    try:
        for _ in range(MAX_FAILED_STEPS_IN_ROW):
            with pytest.raises(EngineFailedError, match="device is gone"):
                loop.submit(GenerationRequest.new([1, 2, 3], SamplingParams(max_tokens=2))).result(timeout=30)
        _wait(lambda: not loop.healthy)
        with pytest.raises(EngineFailedError, match="in a row"):
            loop.submit(GenerationRequest.new([1, 2, 3], SamplingParams(max_tokens=2))).result(timeout=5)
        assert engine.pool.stats().blocks_used == 0
    finally:
        loop.stop()


def test_latest_stats_never_waits_for_a_slow_step(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=64, debug_slow_step_s=2.0)
    with EngineLoop(engine) as loop:
        _wait(lambda: loop.latest_stats is not None)
        idle = loop.latest_stats
        _wait(lambda: loop.latest_stats is not idle, timeout=STATS_IDLE_S * 3)  # idle refresh

        handle = loop.submit(
            GenerationRequest.new(_prompts(83)[0], SamplingParams(max_tokens=3, ignore_eos=True))
        )
        _wait(lambda: engine.report.faults.num_steps >= 1)  # the slow prefill step has begun
        started = time.monotonic()
        for _ in range(100):
            snapshot = loop.latest_stats
            assert loop.healthy
        assert time.monotonic() - started < 0.01, "reading the snapshot waited on the step"
        assert not handle.done() and snapshot is not None
        assert snapshot.generation_tokens == 0  # the step before the slow one

        assert handle.result(timeout=30).finish_reason == "length"
        _wait(lambda: loop.latest_stats is not None and loop.latest_stats.num_running == 0)
        final = loop.latest_stats
        assert final is not None and final.generation_tokens == 3 and final.pool.blocks_used == 0
