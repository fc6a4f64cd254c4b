"""A forced move (session_move_after_turns = K) finds the session's history warm: turn K's worker
hints the worker turn K+1 moves to as soon as turn K's blocks are in Redis, so that worker loads
them (and turn K's partial last block) before turn K+1 comes, and the moved turn fetches nothing
from Redis on its own path (the Redis tier's blocks are deleted before it: only the warm tier and
the kept tails can hold them). Token-exact."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from broker import keys
from broker.sessions import store as session_store
from kvstore.redis.keys import PACK_PREFIX
from ops.redis.server import RedisServer
from tests.integration.conftest import MODEL, WorkerProcess, WorkerStarter, running_api, wait_for
from tests.integration.hint_listeners import listeners, waiting_listeners
from tests.integration.test_routing import _ask, _continued

Reference = Callable[[list[int], int], list[int]]
MOVE_AFTER = 2
BLOCK = 16


@pytest.fixture(scope="module")
def move_api(
    redis_server: RedisServer, files_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    log = tmp_path_factory.mktemp("api-move") / "api.log"
    env = {
        **os.environ,
        "KVFERRY_FILES_DIR": str(files_dir),
        "KVFERRY_SESSION_MOVE_AFTER_TURNS": str(MOVE_AFTER),
    }
    yield from running_api(["--redis-url", redis_server.url, "--model", MODEL], env, log)


def _pushed(pubsub: Any, timeout_s: float) -> bool:
    """Whether an LPUSH onto the subscribed list came within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message is not None and message["data"] == b"lpush":
            return True
    return False


def test_the_moved_turn_finds_its_history_warm(
    move_api: str,
    two_workers: tuple[WorkerProcess, WorkerProcess],
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    ours = {w.name for w in two_workers}

    def only_ours() -> bool:  # an earlier test's worker, stopped, stays live until its heartbeat expires
        names = {n.decode() for n in redis_client.smembers(keys.WORKERS)}
        return all(n in ours or not redis_client.exists(keys.worker_heartbeat(n)) for n in names)

    wait_for(only_ours, 15, "other tests' workers to be gone: turn K+1's worker is chosen among the live")
    tag = uuid.uuid4().hex[:8]
    session = f"move-{tag}"
    messages = [
        {"role": "system", "content": f"Move test {tag}: warm the history ahead of the turn. " * 5},
        {"role": "user", "content": "turn one"},
    ]
    reply, job = _ask(move_api, messages, session)
    first = job["worker"]
    (other,) = [w.name for w in two_workers if w.name != first]
    blocked = listeners(redis_client)
    assert blocked >= len(two_workers), blocked
    db = redis_client.connection_pool.connection_kwargs.get("db", 0)
    before = redis_client.config_get("notify-keyspace-events")["notify-keyspace-events"]
    redis_client.config_set("notify-keyspace-events", "Kl")
    pubsub = redis_client.pubsub()
    pubsub.subscribe(f"__keyspace@{db}__:{keys.worker_prefetch(other)}")
    try:
        for turn in range(2, MOVE_AFTER + 1):
            messages += [
                {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"turn {turn}"},
            ]
            reply, job = _ask(move_api, messages, session)
            assert job["worker"] == first, job["route"]
        # Turn K's worker hints `other` after writing its blocks; `other` loads them, then waits again.
        hinted = _pushed(pubsub, 10)
        if hinted:
            wait_for(lambda: waiting_listeners(redis_client) >= blocked, 10, "the hint to be loaded")
    finally:
        pubsub.close()
        redis_client.config_set("notify-keyspace-events", before)
    history = len(httpx.get(f"{move_api}/v1/sessions/{session}", timeout=10).json()["token_ids"])
    for key in redis_client.scan_iter(match=f"{PACK_PREFIX}*"):
        redis_client.delete(key)  # from here on only a warm tier can hold the history's blocks
    messages += [
        {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
        {"role": "user", "content": "the moved turn"},
    ]
    reply, job = _ask(move_api, messages, session)
    assert job["route"]["reason"] == f"forced move after turn {MOVE_AFTER}: {other} (from {first})", job
    usage, sources = reply["usage"], reply["usage"]["kv_sources"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    # The history: none of it computed again, its partial last block neither (written through as
    # a tail, kept here by the hint). Its last token (the reply's last) has no KV until this turn
    # computes it.
    assert cached >= history - 1, (hinted, history, usage)
    assert sources["pool"] == 0, usage  # nothing of it ran there: all warm ahead of the job
    assert reply["choices"][0]["message"]["content"] == tokenizer.decode(
        _continued(move_api, session, reply, tiny_reference), skip_special_tokens=True
    )


def test_the_moves_worker_killed_after_its_hint_loses_nothing(
    worker_factory: WorkerStarter,
    files_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_reference: Reference,
    tokenizer: Any,
) -> None:
    """Turn K's worker hints turn K+1's, which is SIGKILLed before turn K+1: the turn is answered
    once, token-exact, where the session's blocks are (no other worker to move to), from its cache.
    A fleet of its own (Redis, api, two workers), so the worker killed is nobody else's."""
    with RedisServer(tmp_path_factory.mktemp("redis-move-kill")) as server:
        env = {**os.environ, "KVFERRY_FILES_DIR": str(files_dir), "KVFERRY_SESSION_MOVE_AFTER_TURNS": "2"}
        log = tmp_path_factory.mktemp("api-move-kill") / "api.log"
        api = running_api(["--redis-url", server.url, "--model", MODEL], env, log)
        api_url = next(api)
        workers: dict[str, WorkerProcess] = {}
        try:
            for worker in worker_factory.several(("mk1",), ("mk2",), redis_url=server.url):
                workers[worker.name] = worker
            client = redis.Redis.from_url(server.url)
            session = f"move-kill-{uuid.uuid4().hex[:8]}"
            messages = [{"role": "system", "content": "Kill the move's target. " * 8}]
            for turn in (1, 2):
                messages.append({"role": "user", "content": f"turn {turn}"})
                reply, job = _ask(api_url, messages, session)
                messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            first = job["worker"]
            (target,) = [n for n in workers if n != first]
            record = session_store.load(client, "", session)
            assert record is not None and record.next_worker == target, record

            def hinted() -> bool:  # settled (the record names the whole chain), the hint sent and taken
                now = session_store.load(client, "", session)
                settled = now is not None and len(now.block_hashes) == len(now.token_ids) // BLOCK
                return settled and client.llen(keys.worker_prefetch(target)) == 0

            wait_for(hinted, 30, "turn 2 to settle and its hint to be taken")
            workers[target].kill()
            wait_for(lambda: not client.exists(keys.worker_heartbeat(target)), 15, "its heartbeat to expire")
            messages.append({"role": "user", "content": "the turn that was to move"})
            reply, job = _ask(api_url, messages, session)
            assert job["worker"] == first, job["route"]
            assert "no other worker to move to" in job["route"]["reason"], job["route"]
            assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, reply["usage"]
            assert reply["choices"][0]["message"]["content"] == tokenizer.decode(
                _continued(api_url, session, reply, tiny_reference), skip_special_tokens=True
            )
            assert session_store.load(client, "", session).turns == 3  # answered once, recorded once
        finally:
            api.close()
            for started in workers.values():  # while their Redis is up: without it a warm shutdown waits
                started.stop()
