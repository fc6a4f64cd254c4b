"""InteractivePresence against a real Redis: a worker running an interactive job makes every
worker's loop size its batch steps (workers/jobs/interactive_presence.py), until a linger past the
job's end; with none running anywhere, no worker is told anything."""

from __future__ import annotations

import time

import redis

from broker import keys
from workers.jobs.interactive_presence import InteractivePresence

LINGER_S = 0.5


class Told:
    def __init__(self) -> None:
        self.until: list[float] = []

    def __call__(self, deadline: float) -> None:
        self.until.append(deadline)


def test_an_interactive_job_on_one_worker_reaches_the_others(rds: redis.Redis) -> None:
    a_told, b_told = Told(), Told()
    a = InteractivePresence(rds, LINGER_S, a_told)
    b = InteractivePresence(rds, LINGER_S, b_told)
    a.poll(), b.poll()
    assert not a_told.until and not b_told.until  # nothing flows anywhere

    a.begin()
    time.sleep(LINGER_S + 0.1)  # longer than the linger: a running job keeps it marked
    a.poll(), b.poll()
    now = time.monotonic()
    assert b_told.until and now < b_told.until[-1] <= now + LINGER_S + 0.05

    a.end()  # the linger starts at its end
    b.poll()
    assert b_told.until[-1] > time.monotonic() + LINGER_S - 0.1
    time.sleep(LINGER_S + 0.1)
    told = len(b_told.until)
    b.poll(), a.poll()
    assert len(b_told.until) == told and not rds.exists(keys.INTERACTIVE_FLOWING)  # past: quiet again


def test_the_thread_tells_the_loop_and_stops(rds: redis.Redis) -> None:
    told = Told()
    presence = InteractivePresence(rds, LINGER_S, told)
    presence.start()
    try:
        rds.set(keys.INTERACTIVE_FLOWING, 1, px=int(LINGER_S * 1000))  # another worker's mark
        deadline = time.monotonic() + 5
        while not told.until and time.monotonic() < deadline:
            time.sleep(0.02)
        assert told.until
    finally:
        presence.stop()
    assert not presence._thread.alive
