"""Fault hooks for tests (EngineConfig.debug_*): a slow prefill step, one crashing step."""

from __future__ import annotations

import time
from collections.abc import Sequence

from workers.engine.config import EngineConfig
from workers.engine.scheduling.scheduler import ScheduledSeq


class StepFaults:
    """Called by the engine once per step, right after scheduling. Inert when both hooks are 0."""

    def __init__(self, config: EngineConfig) -> None:
        self.crash_step = config.debug_crash_step
        self.slow_step_s = config.debug_slow_step_s
        self.num_steps = 0  # step() calls so far, including this one

    def on_step(self, scheduled: Sequence[ScheduledSeq]) -> None:
        self.num_steps += 1
        if self.crash_step and self.num_steps == self.crash_step:
            # After scheduling, so recovery must release blocks this step had just appended.
            raise RuntimeError(f"debug_crash_step: engine step {self.num_steps} crashes on purpose")
        if self.slow_step_s > 0 and any(
            s.seq.num_computed_tokens < s.seq.num_prompt_tokens for s in scheduled
        ):
            time.sleep(self.slow_step_s)  # the engine holds no lock; the loop thread just sleeps
