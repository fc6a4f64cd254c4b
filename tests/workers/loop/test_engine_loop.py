"""EngineLoop: many threads submit, one thread steps; concurrent requests share steps."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from broker.errors import InvalidRequestError
from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt
from workers.engine.kernels import omp_team
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.loop.engine_loop import EngineLoop


def test_threads_are_batched_and_streams_add_up(tiny: TinyModel) -> None:
    rng = random.Random(11)
    prompts = [random_prompt(rng, 10 + 7 * i) for i in range(12)]
    engine = make_engine(tiny.loaded, num_blocks=128)
    results: dict[int, tuple[list[RequestOutput], RequestOutput]] = {}
    start = threading.Barrier(len(prompts))

    with EngineLoop(engine) as loop:

        def client(i: int) -> None:
            start.wait()
            handle = loop.submit(GenerationRequest.new(prompts[i], SamplingParams(max_tokens=14, **NO_EOS)))
            deltas = list(handle)
            results[i] = (deltas, handle.result(timeout=60))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        stats = loop.call(lambda e: e.stats())
        loop.call(lambda e: e.check_integrity())

    assert stats.max_batch_seqs > 1, "concurrent submissions were not batched"
    assert stats.pool.blocks_used == 0
    for i, prompt in enumerate(prompts):
        deltas, final = results[i]
        assert_tokens(final.token_ids, tiny.expected(prompt, 14), f"prompt {i} ({len(prompt)} tokens)")
        assert [t for d in deltas for t in d.delta_token_ids] == list(final.token_ids)
        assert "".join(d.delta_text for d in deltas) == final.text
        assert deltas[-1].finished and not any(d.finished for d in deltas[:-1])


def test_bad_request_fails_only_its_handle(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=32)
    with EngineLoop(engine) as loop:
        bad = loop.submit(GenerationRequest.new([], SamplingParams(max_tokens=4)))
        good = loop.submit(GenerationRequest.new([5, 6, 7], SamplingParams(max_tokens=4, **NO_EOS)))
        with pytest.raises(InvalidRequestError, match="empty"):
            bad.result(timeout=30)
        with pytest.raises(InvalidRequestError):
            list(bad)
        assert_tokens(good.result(timeout=30).token_ids, tiny.expected([5, 6, 7], 4), "good request")


def test_cancel_frees_blocks(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=64)
    with EngineLoop(engine) as loop:
        handle = loop.submit(
            GenerationRequest.new(list(range(100, 140)), SamplingParams(max_tokens=400, **NO_EOS))
        )
        first = next(iter(handle))
        assert first.delta_token_ids
        handle.cancel()
        final = handle.result(timeout=30)
        assert final.finish_reason == "abort" and final.finished
        assert loop.call(lambda e: e.pool.stats().blocks_used) == 0
        loop.call(lambda e: e.check_integrity())


def test_stopped_loop_fails_new_submissions(tiny: TinyModel) -> None:
    loop = EngineLoop(make_engine(tiny.loaded, num_blocks=16)).start()
    loop.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        loop.submit(GenerationRequest.new([1, 2, 3], SamplingParams(max_tokens=2))).result(timeout=5)


def test_a_built_loop_makes_and_runs_its_engine_on_its_own_thread(tiny: TinyModel) -> None:
    """EngineLoop.build: the factory runs on the loop's thread, which then steps the engine (one
    thread of the process runs torch's parallel regions: workers/engine/kernels/omp_team.py)."""
    ran_on: list[threading.Thread] = []

    def factory() -> LLMEngine:
        ran_on.append(threading.current_thread())
        return make_engine(tiny.loaded, num_blocks=32)

    loop = EngineLoop.build(factory, name="kvferry-engine-test")
    try:
        assert ran_on[0] is not threading.current_thread() and ran_on[0].name == "kvferry-engine-test"
        stepped_on = loop.call(lambda e: threading.current_thread())
        assert stepped_on is ran_on[0] and loop.healthy
        prompt = random_prompt(random.Random(5), 25)
        out = loop.submit(GenerationRequest.new(prompt, SamplingParams(max_tokens=6, **NO_EOS))).result(60)
        assert_tokens(out.token_ids, tiny.expected(prompt, 6), "built loop")
    finally:
        loop.stop()
    assert not loop.healthy

    def broken() -> LLMEngine:
        raise RuntimeError("no such model")

    with pytest.raises(RuntimeError, match="no such model"):
        EngineLoop.build(broken)


def test_a_confined_thread_runs_torch_on_itself_alone() -> None:
    """omp_team.confine_to_this_thread: that thread's torch ops use a team of one (no second pool of
    OpenMP threads); other threads keep theirs."""
    if omp_team._set_team_size() is None:
        pytest.skip("torch runs no libgomp here")
    mine = torch.get_num_threads()
    seen: list[int] = []

    def confined() -> None:
        omp_team.confine_to_this_thread()
        omp_team.confine_to_this_thread()  # idempotent
        torch.ones(1 << 20).sum()  # a parallel region, on this thread alone
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=confined)
    thread.start()
    thread.join(30)
    assert seen == [1]
    assert torch.get_num_threads() == mine


def test_stats_after_a_job_do_not_walk_the_model(tiny: TinyModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop refreshes its stats snapshot on its own thread right after a job's last step, while
    the job's task thread waits for the GIL to publish the result: the weights' size is counted once,
    when the engine is built, not by walking every parameter again each time."""
    engine = make_engine(tiny.loaded, num_blocks=32)
    weights = tiny.loaded.weights_bytes

    def walked(_: object) -> int:
        raise AssertionError("stats() walked the model's parameters")

    monkeypatch.setattr(type(tiny.loaded), "weights_bytes", property(walked))
    with EngineLoop(engine) as loop:
        prompt = [5, 6, 7, 8]
        final = loop.submit(GenerationRequest.new(prompt, SamplingParams(max_tokens=3, **NO_EOS))).result(
            timeout=60
        )
        stats = loop.call(lambda e: e.stats())
    assert_tokens(final.token_ids, tiny.expected(prompt, 3), "the job")
    assert stats.num_steps > 0 and stats.memory.weights_bytes == weights
    latest = loop.latest_stats  # the snapshot the loop took itself (a failed refresh leaves an old one)
    assert latest is not None and latest.num_steps == stats.num_steps


def test_the_next_step_waits_until_the_first_token_is_out(tiny: TinyModel) -> None:
    """A consumer that reports first_out() gets its first token out before the loop fills the cores
    with the next step; tokens stay exact."""
    engine = make_engine(tiny.loaded, num_blocks=32, first_token_hold_s=60.0)  # only first_out() ends it
    prompt = [11, 12, 13, 14, 15]
    with EngineLoop(engine) as loop:
        handle = loop.submit(
            GenerationRequest.new(prompt, SamplingParams(max_tokens=5, **NO_EOS), reports_first_out=True)
        )
        deltas = iter(handle)
        first = next(deltas)
        steps = engine.report.counters.num_steps
        time.sleep(0.3)  # a tiny model's steps take ms: without the wait, the request would be done
        assert engine.report.counters.num_steps == steps and not handle.done(), "stepped before first_out()"
        handle.first_out()
        handle.result(timeout=10)  # first_out() let it go on (the hold is 60 s)
        rest = list(deltas)
    tokens = [t for d in [first, *rest] for t in d.delta_token_ids]
    assert_tokens(tokens, tiny.expected(prompt, 5), "the request")


def test_a_consumer_that_never_reports_costs_the_hold_once(tiny: TinyModel) -> None:
    """A reporting consumer that never calls first_out() holds the loop first_token_hold_s once,
    then the loop steps on for it and its batch-mate; consumers that do not report are never held."""
    hold = 0.3
    engine = make_engine(tiny.loaded, num_blocks=32, first_token_hold_s=hold)
    prompts = {"silent": [21, 22, 23], "mate": [31, 32, 33, 34]}
    with EngineLoop(engine) as loop:
        mate = loop.submit(GenerationRequest.new(prompts["mate"], SamplingParams(max_tokens=40, **NO_EOS)))
        next(iter(mate))  # decoding: the silent one's first token comes in a step the mate shares
        started = time.monotonic()
        silent = loop.submit(
            GenerationRequest.new(
                prompts["silent"], SamplingParams(max_tokens=6, **NO_EOS), reports_first_out=True
            )
        )
        assert_tokens(silent.result(timeout=30).token_ids, tiny.expected(prompts["silent"], 6), "silent")
        held = time.monotonic() - started
        assert_tokens(mate.result(timeout=30).token_ids, tiny.expected(prompts["mate"], 40), "mate")
    assert hold <= held < 20 * hold, held
    quiet = make_engine(tiny.loaded, num_blocks=32, first_token_hold_s=60.0)
    with EngineLoop(quiet) as loop:  # no consumer reports: the 60 s hold never applies
        handle = loop.submit(GenerationRequest.new(prompts["mate"], SamplingParams(max_tokens=6, **NO_EOS)))
        assert_tokens(handle.result(timeout=10).token_ids, tiny.expected(prompts["mate"], 6), "unheld")
