"""The gap after a batch-only step (interactive_batch_duty, BatchSizer.pause): while interactive
traffic flows, the loop leaves each step that carried only batch rows followed by an idle gap, an
interactive submit ends the gap at once, and once the traffic is past the batch runs back to back;
tokens stay exact."""

from __future__ import annotations

import itertools
import time

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine
from workers.engine.requests.request import GenerationRequest
from workers.loop.engine_loop import EngineLoop

STEP_S = 0.25  # every step "costs" this on the engine's cost clock (a tiny model's take ms)
DUTY = 0.1  # a batch-only step is then followed by a gap of 9 x 0.25 = 2.25 s


def test_batch_only_steps_leave_a_gap_that_an_interactive_arrival_ends(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=64, interactive_batch_duty=DUTY)
    ticks = itertools.count()
    engine.scheduler.cost.clock = lambda: next(ticks) * STEP_S
    batch_prompt, probe_prompt = [41, 42, 43, 44, 45], [51, 52, 53]
    with EngineLoop(engine) as loop:
        loop.interactive_flows_until(time.monotonic() + 600)  # traffic flows elsewhere in the fleet
        batch = loop.submit(
            GenerationRequest.new(batch_prompt, SamplingParams(max_tokens=30, **NO_EOS), job_class="batch")
        )
        time.sleep(1.0)
        steps = engine.report.counters.num_steps
        assert steps == 1 and not batch.done(), f"{steps} steps in 1 s: no gap after batch-only steps"
        started = time.monotonic()
        probe = loop.submit(GenerationRequest.new(probe_prompt, SamplingParams(max_tokens=3, **NO_EOS)))
        assert_tokens(probe.result(timeout=30).token_ids, tiny.expected(probe_prompt, 3), "probe")
        waited = time.monotonic() - started
        assert waited < 1.0, f"waited {waited:.2f} s: the gap (1.25 s left) did not end"
        loop.interactive_flows_until(0.0)  # the fleet's traffic is past; the probe's linger is 1 s
        final = batch.result(timeout=30)
    assert_tokens(final.token_ids, tiny.expected(batch_prompt, 30), "batch")
    assert engine.scheduler.sizer.pause(True, STEP_S) == STEP_S * (1 / DUTY - 1)
