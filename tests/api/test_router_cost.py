"""Routing by expected cost (api/routing/cost.py) and the forced move of session_move_after_turns,
against real Redis state (heartbeats, prefix digests, session records, prefetch hints)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aioredis

from api.routing.cost import DECODE_ROW, SEAT_WAIT, backlog
from api.routing.memory import RoutingMemory
from api.routing.recent import RecentRoutes, Routed
from api.routing.router import Route, choose_queue
from broker import keys
from broker.messages import ChatMessage, EngineFigures, GenerateJob, SessionRecord, WorkerStatus
from broker.routing import prefetch_hint, prefix_index
from broker.routing.prefix_digest import chat_digests
from broker.sessions import store as session_store
from broker.worker_registry import HEARTBEAT_FIELD, encode_status
from ops.settings import Settings

LONG = ChatMessage("system", "Answer carefully, briefly and politely. " * 50)  # a long system prompt
HISTORY = (LONG, ChatMessage("user", "q1"), ChatMessage("assistant", "a1"))
MEMORY = RoutingMemory()  # one api process's, kept across this file's decisions (api/context.py)


def _figures(running: int = 0, pending: int = 0, waiting: int = 0) -> EngineFigures:
    zeros = (0, 0, 0, 10, 0, 0, 1, 0, 0, 0.0, 0, 0)
    return EngineFigures(running, waiting, *zeros, prefill_tokens_pending=pending)


def _beat(rds: redis.Redis, name: str, running: int = 0, pending: int = 0, waiting: int = 0) -> None:
    figures = _figures(running, pending, waiting)
    status = WorkerStatus(name, keys.worker_queue(name), "m", running + waiting, 0, 0, time.time(), figures)
    rds.hset(keys.worker_heartbeat(name), HEARTBEAT_FIELD, encode_status(status))
    rds.expire(keys.worker_heartbeat(name), 30)
    rds.sadd(keys.WORKERS, name)


def _advertise(rds: redis.Redis, name: str, messages: tuple[ChatMessage, ...]) -> None:
    pipe = rds.pipeline()
    prefix_index.advertise(pipe, name, chat_digests("m", "", messages), time.time())
    pipe.execute()


def _session(rds: redis.Redis, sid: str, worker: str, turns: int) -> None:
    session_store.save(rds, SessionRecord(sid, "", "m", (1, 2, 3), (), worker, time.time(), turns), 60)


def _route(
    redis_url: str,
    job: GenerateJob,
    move_after: int = 0,
    redis_tier: bool = True,
    job_id: str = "",
    move_every: int = 0,
) -> Route:
    async def go() -> Route:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await choose_queue(
                client,
                job,
                max_waiting=4,
                move_after=move_after,
                redis_tier=redis_tier,
                job_id=job_id,
                memory=MEMORY,
                move_every=move_every,
            )
        finally:
            await client.aclose()

    return asyncio.run(go())


def _next_turn(session: str | None = None) -> GenerateJob:
    return GenerateJob(
        model="m", endpoint="chat", messages=(*HISTORY, ChatMessage("user", "q2")), session_id=session
    )


@pytest.fixture
def clean(rds: redis.Redis) -> redis.Redis:
    rds.flushall()
    return rds


def test_a_busy_holder_loses_the_turn_when_the_redis_tier_makes_the_move_cheap(
    clean: redis.Redis, redis_url: str
) -> None:
    _beat(clean, "a")
    _beat(clean, "b", running=6)
    _advertise(clean, "b", HISTORY)
    route = _route(redis_url, _next_turn())
    assert route.queue == keys.worker_queue("a"), route
    assert route.reason.startswith("load balance: a (b has 6 jobs, a 0), expected cost"), route
    # Without the Redis tier a would recompute the long history: staying costs less.
    _beat(clean, "b", running=6)  # a fresh heartbeat: the route above is no longer "since"
    route = _route(redis_url, _next_turn(), redis_tier=False)
    assert route == Route(keys.worker_queue("b"), "prefix match: 3/4 messages on b"), route


def test_a_chunked_prefill_under_way_counts_as_load(clean: redis.Redis, redis_url: str) -> None:
    _beat(clean, "a", pending=2000)
    _beat(clean, "b")
    for name in ("a", "b"):
        _advertise(clean, name, HISTORY[:1])
    assert _route(redis_url, _next_turn()).queue == keys.worker_queue("b")


def test_forced_move_after_turn_k(clean: redis.Redis, redis_url: str) -> None:
    _beat(clean, "a")
    _beat(clean, "b", running=3)  # busier: only the forced move sends the session there
    _advertise(clean, "a", HISTORY)
    _session(clean, "s1", "a", turns=1)
    assert _route(redis_url, _next_turn("s1"), move_after=2).reason == "session affinity: a"
    _session(clean, "s1", "a", turns=2)
    moved = _route(redis_url, _next_turn("s1"), move_after=2)
    assert moved == Route(keys.worker_queue("b"), "forced move after turn 2: b (from a)"), moved
    # The new worker is told to load the session's blocks while the job waits in its queue.
    hints = [prefetch_hint.decode(raw) for raw in clean.lrange(keys.worker_prefetch("b"), 0, -1)]
    assert [h.session_id for h in hints if h is not None] == ["s1"], hints
    assert _route(redis_url, _next_turn("s1"), move_after=0).reason == "session affinity: a"  # off
    _beat(clean, "a")
    _beat(clean, "b")  # fresh heartbeats, as loads even out
    _session(clean, "s1", "b", turns=3)  # served there: it stays
    assert _route(redis_url, _next_turn("s1"), move_after=2).reason == "session affinity: b"


def test_with_every_m_turns_moves_repeat_and_the_turn_before_is_hinted(
    clean: redis.Redis, redis_url: str
) -> None:
    """session_move_every_turns = M (K = 2, M = 2): turns 3, 5, 7 move, 2, 4, 6 stay and choose
    where the next one goes; with M = 0 only turn 3 moves."""
    _beat(clean, "a")
    _beat(clean, "b", running=3)  # busier: only a forced move sends the session there
    _advertise(clean, "a", HISTORY)
    for done in range(1, 7):
        _session(clean, "s1", "a", turns=done)
        route = _route(redis_url, _next_turn("s1"), move_after=2, move_every=2)
        if done % 2 == 0:
            assert route == Route(keys.worker_queue("b"), f"forced move after turn {done}: b (from a)"), route
        else:
            assert (route.reason, route.prefetch_to) == ("session affinity: a", "b"), (done, route)
        once = _route(redis_url, _next_turn("s1"), move_after=2)
        assert once.reason.startswith("forced move") == (done == 2), (done, once)


def test_turn_k_chooses_the_worker_turn_k_plus_1_moves_to(clean: redis.Redis, redis_url: str) -> None:
    """Routing turn K (move_after = K), the router picks where turn K+1 will go, so that turn K's
    worker can hint it once the turn's blocks are in Redis; turn K+1 then goes exactly there."""
    for name, running in (("a", 0), ("b", 2), ("c", 4)):
        _beat(clean, name, running=running)
    _advertise(clean, "a", HISTORY)
    _session(clean, "s1", "a", turns=1)
    turn_k = _route(redis_url, _next_turn("s1"), move_after=2)
    assert (turn_k.reason, turn_k.prefetch_to) == ("session affinity: a", "b"), turn_k  # b: cheaper than c
    assert _route(redis_url, _next_turn("s1"), move_after=3).prefetch_to == ""  # not turn K
    assert _route(redis_url, _next_turn(), move_after=2).prefetch_to == ""  # no session
    first = GenerateJob(model="m", endpoint="chat", messages=(ChatMessage("user", "hi"),), session_id="s2")
    for name, running in (("a", 0), ("b", 2), ("c", 4)):
        _beat(clean, name, running=running)  # fresh heartbeats: the routes above are not "since"
    turn_1 = _route(redis_url, first, move_after=1)  # K = 1: no record yet
    assert (turn_1.worker, turn_1.prefetch_to) == ("a", "b"), turn_1
    # Turn K+1 follows the record's next_worker though c is the cheapest now ...
    for name, running in (("a", 0), ("b", 2), ("c", 0)):
        _beat(clean, name, running=running)
    record = SessionRecord("s1", "", "m", (1, 2, 3), (), "a", time.time(), 2, next_worker="b")
    session_store.save(clean, record, 60)
    moved = _route(redis_url, _next_turn("s1"), move_after=2)
    assert moved == Route(keys.worker_queue("b"), "forced move after turn 2: b (from a)"), moved
    # ... while it is ready; gone, the cheapest other as before.
    clean.delete(keys.worker_heartbeat("b"))
    moved = _route(redis_url, _next_turn("s1"), move_after=2)
    assert moved == Route(keys.worker_queue("c"), "forced move after turn 2: c (from a)"), moved


def test_forced_move_with_no_other_worker_stays(clean: redis.Redis, redis_url: str) -> None:
    _beat(clean, "a")
    _session(clean, "s1", "a", turns=2)
    route = _route(redis_url, _next_turn("s1"), move_after=2)
    assert route == Route(
        keys.worker_queue("a"), "session affinity: a; no other worker to move to after turn 2"
    )


def test_the_setting_reaches_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVFERRY_SESSION_MOVE_AFTER_TURNS", "3")
    assert Settings.from_env().api_config().session_move_after_turns == 3
    assert Settings.from_env(redis_cache_size=0).api_config().redis_tier is False
    with pytest.raises(ValueError, match="session_move_after_turns"):
        Settings.from_env(session_move_after_turns=-1).api_config()


def test_a_burst_of_new_sessions_is_placed_by_load_not_left_to_the_shared_queue(
    clean: redis.Redis, redis_url: str
) -> None:
    """The shared queue's first taker would prefetch the whole burst, and affinity then keeps it."""
    _beat(clean, "a")
    _beat(clean, "b")
    prompts = [(ChatMessage("system", f"prompt {i}: " + "be brief. " * 50),) for i in range(8)]
    first = [
        _route(redis_url, GenerateJob(model="m", endpoint="chat", messages=prompts[i], session_id=f"n{i}"))
        for i in range(8)
    ]
    assert sorted(r.queue for r in first) == [keys.worker_queue("a")] * 4 + [keys.worker_queue("b")] * 4, (
        first
    )
    assert all(r.reason.endswith(", no worker holds this prefix") for r in first), first
    # Without a session, the shared queue as before.
    assert (
        _route(
            redis_url, GenerateJob(model="m", endpoint="chat", messages=(ChatMessage("user", "new"),))
        ).queue
        == keys.SHARED_QUEUE
    )


def test_a_burst_of_sessions_on_a_few_system_prompts_is_grouped_by_prompt(
    clean: redis.Redis, redis_url: str
) -> None:
    """Before any of them is advertised: the sessions sharing a system prompt go where its first
    one went (computed once there), the prompts spread by load."""
    _beat(clean, "a")
    _beat(clean, "b")
    systems = [ChatMessage("system", f"You are assistant {k}. " + "Be brief. " * 100) for k in range(2)]
    routes = [
        _route(
            redis_url,
            GenerateJob(
                model="m",
                endpoint="chat",
                messages=(systems[i % 2], ChatMessage("user", f"q{i}")),
                session_id=f"g{i}",
            ),
        )
        for i in range(8)
    ]
    by_prompt = [{r.queue for r in routes[k::2]} for k in range(2)]
    assert all(len(queues) == 1 for queues in by_prompt), routes
    assert by_prompt[0] != by_prompt[1], routes
    assert all(r.reason.endswith("routed there lately") for r in routes[2:]), routes


def test_the_sessions_own_last_job_is_not_counted_against_its_worker(
    clean: redis.Redis, redis_url: str
) -> None:
    """The heartbeat came while the session's last turn ran: that job has ended since, and its
    seat went to one of those waiting."""
    _beat(clean, "a", running=4, waiting=2)
    _beat(clean, "b", running=4)
    _advertise(clean, "a", HISTORY)
    session_store.save(clean, SessionRecord("s9", "", "m", (1, 2, 3), (), "a", time.time() - 5, 1), 60)
    route = _route(redis_url, _next_turn("s9"))
    assert route.reason.startswith("load balance: b (a has 6 jobs, b 4; 2 and 0 waiting)"), route
    _beat(clean, "a", running=4, waiting=2)
    _beat(clean, "b", running=4)
    _session(clean, "s9", "a", turns=1)  # it ended after a's heartbeat: one waits there, not two
    assert _route(redis_url, _next_turn("s9")).reason == "session affinity: a"


def test_a_burst_of_sessions_on_one_system_prompt_does_not_pile_on_one_worker(
    clean: redis.Redis, redis_url: str
) -> None:
    _beat(clean, "a")
    _beat(clean, "b")
    system = ChatMessage("system", "You are the only assistant. " + "Be brief. " * 100)
    queues = [
        _route(
            redis_url,
            GenerateJob(
                model="m",
                endpoint="chat",
                messages=(system, ChatMessage("user", f"q{i}")),
                session_id=f"o{i}",
            ),
        ).queue
        for i in range(8)
    ]
    # The first computes the prompt where it goes; the rest load it from the Redis tier once
    # written through, each much cheaper than that first prefill, so the other worker takes more
    # of them, never all.
    first, other = queues[0], ({keys.worker_queue(n) for n in ("a", "b")} - {queues[0]}).pop()
    assert 1 <= queues.count(first) < queues.count(other), queues


def test_turns_that_come_back_together_do_not_all_wait_on_one_workers_step(
    clean: redis.Redis, redis_url: str
) -> None:
    """Sessions whose turns ended in one step on a send their next turns at once: each turn routed
    to a since its heartbeat counts there as the prefill it will compute, so the second turn
    already costs more on a (the first's new tokens ahead of it in the step, more than a seat's
    wait: SESSION_MOVE_MARGIN) than a move, whose history the Redis tier loads. Counted as bare
    sequences, a kept the first three."""
    _beat(clean, "a")
    _beat(clean, "b")
    _advertise(clean, "a", HISTORY)
    question = ChatMessage("user", "Now answer this longer follow-up question, point by point. " * 24)
    reasons = []
    for i in range(4):
        session_store.save(clean, SessionRecord(f"c{i}", "", "m", (1,), (), "a", time.time() - 5, 1), 60)
        job = GenerateJob(model="m", endpoint="chat", messages=(*HISTORY, question), session_id=f"c{i}")
        reasons.append(_route(redis_url, job).reason)
    assert reasons[0] == "session affinity: a", reasons
    assert reasons[1].startswith("load balance: b (a has 1 jobs, b 0)"), reasons
    assert {r.split(":")[0] for r in reasons} == {"session affinity", "load balance"}, reasons


def test_a_sessions_next_turn_before_the_next_heartbeat_stays_with_its_blocks(
    clean: redis.Redis, redis_url: str
) -> None:
    """Its first turn, routed since the heartbeats, counted as the long prompt it would compute;
    that turn has ended (the session's record says so), so none of it is counted against the
    next turn, which would otherwise move off its blocks."""
    _beat(clean, "a")
    _beat(clean, "b")
    first = _route(redis_url, GenerateJob(model="m", endpoint="chat", messages=HISTORY[:2], session_id="q"))
    home = first.worker
    assert home is not None and first.reason.startswith("least loaded"), first
    _advertise(clean, home, HISTORY)
    _session(clean, "q", home, turns=1)  # it ended after the heartbeats
    assert _route(redis_url, _next_turn("q")).reason == f"session affinity: {home}"


def test_recent_routes_count_the_jobs_and_their_expected_prefill_since_a_time() -> None:
    recent = RecentRoutes()
    recent.add("a", 100.0)
    mark = time.time()
    time.sleep(0.01)
    recent.add("a", 30.0)
    recent.add("a")
    recent.add("b", 7.0)
    assert recent.since("a", mark - 1) == Routed(3, 130.0)
    assert recent.since("a", mark) == Routed(2, 30.0)
    assert recent.since("b", mark) == Routed(1, 7.0)
    assert recent.since("c", mark) == Routed()
    recent.add("b", 50.0, session="t\0s")
    assert recent.since("b", mark, ended="t\0s") == Routed(2, 7.0)  # its prefill is done
    recent.add("b", 20.0, job_id="j1")
    recent.prefilled("j1")  # the api saw its first token
    assert recent.since("b", mark) == Routed(3, 57.0)


def test_recent_routes_forget_what_they_did_not_route_and_what_is_past_the_horizon() -> None:
    recent = RecentRoutes(horizon_s=0.05)
    recent.prefilled("never-routed-here")  # a shared-queue job's first token: nothing to mark
    recent.add("a", 40.0, job_id="old")
    assert recent.since("a", 0.0) == Routed(1, 40.0)
    time.sleep(0.1)
    recent.add("a", 5.0, job_id="new")
    assert recent.since("a", 0.0) == Routed(1, 5.0)  # "old" is past the horizon, forgotten
    assert set(recent._by_job) == {"new"}  # nothing kept for jobs it forgot or never routed


def test_jobs_seen_ending_since_the_heartbeat_no_longer_weigh_on_their_worker(
    clean: redis.Redis, redis_url: str
) -> None:
    """A cohort that just ended on its worker: the heartbeat still counts it, the api knows better,
    and the next job stays with the blocks instead of moving to a worker that only looks lighter."""
    _beat(clean, "a")  # b is not up yet: the cohort goes to a, the only worker
    _advertise(clean, "a", HISTORY)
    ids = [f"cohort-{time.time()}-{i}" for i in range(6)]
    for job_id in ids:
        assert _route(redis_url, _next_turn(), job_id=job_id).worker == "a"
        MEMORY.prefilled(job_id)  # decoding by the heartbeat below
    time.sleep(0.01)
    _beat(clean, "a", running=6)  # the heartbeat shows them
    _beat(clean, "b", running=2)
    assert _route(redis_url, _next_turn()).reason.startswith("load balance: b"), "a looks busier"
    _beat(clean, "a", running=6)  # fresh heartbeats, as before: the route to b has ended
    _beat(clean, "b", running=2)
    time.sleep(0.01)
    for job_id in ids:
        MEMORY.ended(job_id)  # the api saw them end, after the heartbeats
    assert _route(redis_url, _next_turn()).reason == "prefix match: 3/4 messages on a"


def test_a_sessions_last_turn_seen_ending_is_taken_off_its_worker_once(
    clean: redis.Redis, redis_url: str
) -> None:
    """Seen ending by this api (RecentRoutes) and ended after the heartbeat (the session record's
    last_used: Backlog.less_one_ended): one job, taken off once."""
    sid, job_id = f"once-{time.time()}", f"once-{time.time()}"
    _beat(clean, "a")
    _advertise(clean, "a", HISTORY)
    assert _route(redis_url, _next_turn(sid), job_id=job_id).worker == "a"
    MEMORY.prefilled(job_id)
    time.sleep(0.01)
    _beat(clean, "a", running=2, waiting=4)  # its last turn and 5 others
    _beat(clean, "b", running=1)
    time.sleep(0.01)
    _session(clean, sid, "a", turns=1)  # its record: ended after the heartbeat
    MEMORY.ended(job_id)
    route = _route(redis_url, _next_turn(sid))
    assert route.reason.startswith("load balance: b (a has 5 jobs, b 1; 3 and 0 waiting)"), route


def test_recent_routes_take_off_what_the_heartbeat_counts_but_has_ended_or_prefilled_since() -> None:
    recent = RecentRoutes()
    recent.add("a", 100.0, session="t\0s", job_id="j1")
    recent.add("a", 40.0, job_id="j2")
    recent.add("a", 10.0, job_id="j3")
    recent.add("a", 5.0, job_id="j5")
    recent.prefilled("j1")
    recent.prefilled("j3")  # j1 and j3 decode by the heartbeat
    time.sleep(0.01)
    beat = time.time()  # it counts j1, j3 and perhaps j2 and j5 (or they wait in the queue still)
    time.sleep(0.01)
    recent.prefilled("j2")
    recent.ended("j3")
    recent.ended("j5")  # it had no first token by the heartbeat, which may not count it: left there
    assert recent.since("a", beat) == Routed(0, 0.0, gone=1, prefill_done=45.0)
    recent.ended("j1")  # the session's own turn, off once: less_one_ended is told (own_ended)
    assert recent.since("a", beat, ended="t\0s") == Routed(0, 0.0, gone=2, prefill_done=45.0, own_ended=True)
    assert recent.since("a", beat) == Routed(0, 0.0, gone=2, prefill_done=45.0)
    assert recent.since("a", time.time()) == Routed()  # a heartbeat after the ends counts none of them
    recent.add("a", 30.0, session="t\0u", job_id="j4")
    recent.ended("j4")  # routed and ended after that heartbeat: it counts nothing
    assert recent.since("a", beat) == Routed(0, 0.0, gone=2, prefill_done=45.0)
    assert recent.since("a", beat, ended="t\0u") == Routed(0, 0.0, gone=2, prefill_done=45.0, own_ended=True)


def test_sequences_waiting_weigh_a_seat_each_and_what_comes_after_them_waits_too() -> None:
    """A worker that shows sequences waiting is full: the jobs its Celery threads hold and those
    routed to it since wait as well, and one seen ending frees a seat for one of them. With none
    waiting, they are rows."""
    full = WorkerStatus("a", "q", "m", 7, 0, 0, time.time(), _figures(running=4, waiting=2))
    held = backlog(full, Routed(jobs=2, gone=1))
    assert (held.running, held.waiting) == (4, 2 + 1 + 2 - 1), held  # a Celery-held job, 2 routed, 1 gone
    assert held.cost == DECODE_ROW * 4 + SEAT_WAIT * 4
    room = WorkerStatus("b", "q", "m", 5, 0, 0, time.time(), _figures(running=4))
    held = backlog(room, Routed(jobs=2, gone=1))
    assert (held.running, held.waiting) == (4 + 1 + 2 - 1, 0), held
    assert held.cost == DECODE_ROW * 6


def test_a_new_conversation_avoids_a_queue_rather_than_rows(clean: redis.Redis, redis_url: str) -> None:
    """Three sequences waiting on a cost the next job three seats' turnover; b's eight decoding
    rows cost it a share of each step. Counted alike, a (5 sequences) looked the lighter."""
    _beat(clean, "a", running=2, waiting=3)
    _beat(clean, "b", running=8)
    for name in ("a", "b"):
        _advertise(clean, name, HISTORY[:1])
    new = GenerateJob(model="m", endpoint="chat", messages=(LONG, ChatMessage("user", "hello")))
    assert _route(redis_url, new).queue == keys.worker_queue("b")


def test_a_session_leaves_its_history_only_to_escape_a_queue(clean: redis.Redis, redis_url: str) -> None:
    """SESSION_MOVE_MARGIN: a few more rows on its worker (which admits the turn at once) or one more
    sequence waiting there (noise at a heartbeat's age) keep the session; a longer queue moves it,
    to a worker with room only."""
    _advertise(clean, "a", HISTORY)
    for a, b, moves in (
        ({"running": 7}, {"running": 1}, False),  # rows only; before, a move: 6 rows > the load + 16
        ({"running": 5, "waiting": 1}, {"running": 5}, False),  # a queue of one
        ({"running": 4, "waiting": 2}, {"running": 6}, True),
        ({"running": 4, "waiting": 4}, {"running": 6, "waiting": 1}, False),  # b is full too
    ):
        # its last turn ended before the heartbeats
        session_store.save(clean, SessionRecord("s-q", "", "m", (1,), (), "a", time.time() - 5, 1), 60)
        _beat(clean, "a", **a)
        _beat(clean, "b", **b)
        route = _route(redis_url, _next_turn("s-q"))
        assert route.reason.startswith("load balance: b") == moves, (a, b, route)
        assert route.worker == ("b" if moves else "a"), route


def test_a_session_leaving_a_queue_goes_to_the_cheapest_worker_with_room(
    clean: redis.Redis, redis_url: str
) -> None:
    """b costs least (one sequence waiting, no rows) but is full; c, busier by rows, has room."""
    _advertise(clean, "a", HISTORY)
    session_store.save(clean, SessionRecord("s-r", "", "m", (1,), (), "a", time.time() - 5, 1), 60)
    _beat(clean, "a", running=4, waiting=3)
    _beat(clean, "b", waiting=1)
    _beat(clean, "c", running=18)
    route = _route(redis_url, _next_turn("s-r"))
    assert route.worker == "c" and route.reason.startswith("load balance: c"), route
