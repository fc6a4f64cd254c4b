"""The sessions between turns, by worker (api/routing/homed.py), and a new session's placement by
them (api/routing/cost.py, THINKING_ROW), against real Redis state."""

from __future__ import annotations

import asyncio
import math

import pytest
import redis
import redis.asyncio as aioredis

from api.routing.homed import MIN_THINK_S, HomedSessions
from api.routing.memory import RoutingMemory
from api.routing.router import Route, choose_queue
from broker.messages import ChatMessage, GenerateJob
from tests.api.test_router_cost import _advertise, _beat

SYSTEM = ChatMessage("system", "You are the assistant. " + "Be brief. " * 100)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_thinks_from_its_turns_end_until_its_next_turn() -> None:
    homes = HomedSessions(clock=Clock())
    homes.routed("s1", "a", "j1")
    homes.routed("s2", "a", "j2")
    homes.routed("", "a", "j3")  # no session: not counted
    assert homes.thinking() == {}  # running: the heartbeat counts those
    homes.ended("j1")
    homes.ended("j3")
    homes.ended("unknown")
    assert homes.thinking() == {"a": 1.0}
    assert homes.thinking(exclude="s1") == {}  # the session being routed is not its own load
    homes.routed("s1", "b", "j4")  # its next turn, moved: running again
    homes.ended("j1")  # seen twice: nothing more
    assert homes.thinking() == {}
    homes.ended("j4")
    homes.ended("j2")
    assert homes.thinking() == {"a": 1.0, "b": 1.0}


def test_an_older_turn_ending_late_changes_nothing() -> None:
    homes = HomedSessions(clock=Clock())
    homes.routed("s1", "a", "j1")
    homes.routed("s1", "b", "j2")  # a retry or a new turn before the api saw j1 end
    homes.ended("j1")
    assert homes.thinking() == {}
    homes.ended("j2")
    assert homes.thinking() == {"b": 1.0}
    homes.routed("s1", "a", "")  # a turn with no job id: s1 is running again, its end unseen
    assert homes.thinking() == {}


def test_a_silent_session_weighs_less_by_the_think_times_seen() -> None:
    clock = Clock()
    homes = HomedSessions(horizon_s=30, clock=clock)
    assert homes.think_s == 3.0  # none seen yet: a tenth of the horizon
    homes.routed("s1", "a", "j1")
    homes.ended("j1")
    clock.now += 1.0
    homes.routed("s1", "a", "j2")  # back after 1 s: the mean moves a tenth of the way
    assert homes.think_s == pytest.approx(2.8)
    homes.ended("j2")
    clock.now += 2.8
    assert homes.thinking()["a"] == pytest.approx(math.exp(-1))
    clock.now += 15.0
    homes.routed("s2", "b", "j3")  # s2 is new: no think time of its own
    homes.ended("j3")
    assert homes.think_s == pytest.approx(2.8)
    assert homes.thinking() == {"b": 1.0}  # s1, over six think times silent, weighs nothing
    for i in range(100):  # a client sending its next turn at once: the mean stops at its floor
        homes.routed("s2", "b", f"k{i}")
        homes.ended(f"k{i}")
    assert homes.think_s == MIN_THINK_S


def test_sessions_past_the_horizon_or_the_bound_are_forgotten() -> None:
    clock = Clock()
    homes = HomedSessions(horizon_s=60, max_sessions=3, clock=clock)
    for i in range(4):
        homes.routed(f"s{i}", "a", f"j{i}")
        homes.ended(f"j{i}")
    assert homes.thinking() == {"a": 3.0}  # the oldest dropped for the bound
    clock.now += 61
    homes.routed("s1", "a", "j5")  # forgotten past the horizon: no think time of 61 s is seen
    assert homes.think_s == 6.0 and homes.thinking() == {}
    for i in range(5):  # running turns are bounded too: the oldest are forgotten
        homes.routed(f"r{i}", "b", f"q{i}")
    homes.ended("q0")
    homes.ended("q4")
    assert homes.thinking() == {"b": 1.0}


def _new_session(redis_url: str, memory: RoutingMemory, sid: str, shared: bool) -> Route:
    system = SYSTEM if shared else ChatMessage("system", f"You are assistant {sid}. " + "Be brief. " * 100)
    job = GenerateJob(
        model="m",
        endpoint="chat",
        messages=(system, ChatMessage("user", f"hello from {sid}")),
        session_id=sid,
    )

    async def go() -> Route:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await choose_queue(client, job, max_waiting=4, job_id=f"job-{sid}", memory=memory)
        finally:
            await client.aclose()

    return asyncio.run(go())


def _two_workers(rds: redis.Redis) -> None:
    """Heartbeats of a and b, a sequence running on each."""
    _beat(rds, "a", running=1)
    _beat(rds, "b", running=1)


def _memory() -> RoutingMemory:
    """With think times of 360 s: a session ended a second ago still weighs 1.0."""
    return RoutingMemory(homes=HomedSessions(horizon_s=3600))


def _thinking(memory: RoutingMemory, worker: str, n: int) -> None:
    """n sessions whose turns on `worker` the api saw routed and end."""
    for i in range(n):
        memory.homes.routed(f"{worker}{i}", worker, f"job-{worker}{i}")
        memory.ended(f"job-{worker}{i}")


def test_a_new_session_goes_where_fewer_sessions_think(rds: redis.Redis, redis_url: str) -> None:
    """Equal rows: a new session goes to b while more of a's sessions are between turns, and to a
    once b has more."""
    rds.flushall()
    memory = _memory()
    _two_workers(rds)
    _thinking(memory, "a", 2)
    route = _new_session(redis_url, memory, "new1", shared=False)
    assert route.worker == "b" and route.reason.startswith("least loaded: b"), route
    memory.ended("job-new1")
    _thinking(memory, "b", 2)
    _two_workers(rds)  # fresh heartbeats: new1 no longer counts as routed since
    assert memory.homes.thinking() == pytest.approx({"a": 2, "b": 3}, rel=1e-3)  # ended just now
    assert _new_session(redis_url, memory, "new2", shared=False).worker == "a"


def test_a_new_session_leaves_its_prompts_holder_for_enough_sessions_thinking_there(
    rds: redis.Redis, redis_url: str
) -> None:
    """The system prompt on a: with no session between turns, a new one goes there (its prompt
    cached); with three of a's sessions just ended (three rows to come) it goes to b, loading the
    prompt from the Redis tier."""
    rds.flushall()
    _two_workers(rds)
    _advertise(rds, "a", (SYSTEM,))
    kept = _new_session(redis_url, RoutingMemory(), "kept", shared=True)
    assert kept.reason.startswith("prefix match: 1/2"), kept
    memory = _memory()
    _two_workers(rds)
    _thinking(memory, "a", 3)
    route = _new_session(redis_url, memory, "moved", shared=True)
    assert route.worker == "b" and route.reason.startswith("load balance: b"), route
    assert route.reason.endswith("; rows to come 48 and 0), expected cost 72 vs 48 token equivalents"), route
