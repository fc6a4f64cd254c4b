"""Sessions across workers, Redis tiers and restarts: every continuation is token-exact."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from broker import keys
from broker.messages import GenerateResult
from broker.sessions import store as session_store
from ops.redis.server import RedisServer
from tests.integration.conftest import MODEL, WorkerProcess, tiny_block_bytes, wait_for
from tests.integration.jobs import chat as _chat
from tests.integration.jobs import wait_settled

Reference = Callable[[list[int], int], list[int]]
SYSTEM = "You are a patient assistant who answers every question in full sentences. " * 4  # ~64+ tokens
BLOCK = 16
BLOCK_BYTES = tiny_block_bytes()  # in the run's KV dtype (fp32 unless KVFERRY_TEST_* say otherwise)


def _expected(tokenizer: Any, reference: Reference, messages: list[dict[str, str]], n: int) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return reference(ids, n)


def _continued(client: redis.Redis, session: str, result: GenerateResult, reference: Reference) -> list[int]:
    """HF's answer on the prompt ids the worker used for a session's turn (the record holds them,
    then the output): a continued turn reuses the ids its last turn ended with (workers/jobs/prompt.py),
    which re-tokenising the history need not give."""
    raw: Any = client.get(keys.session("", session))
    assert raw is not None
    record = session_store.decode(raw)
    assert record is not None
    return reference(list(record.token_ids[: result.usage.prompt_tokens]), len(result.token_ids))


def _conversation(turns: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"question {i}"}]
        for i in range(turns)
    ]


@pytest.mark.fp32_only(reason="each turn's tokens equal HF fp32 generate's")
def test_session_migrates_to_another_worker_from_redis(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    w1, w2 = two_workers
    session = f"migrate-{uuid.uuid4().hex[:8]}"
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello there, first turn"}]
    r1 = _chat(celery_app, turn1, session, w1.queue)
    assert r1.worker == w1.name and list(r1.token_ids) == _expected(tokenizer, tiny_reference, turn1, 8)
    turn2 = [
        *turn1,
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": "and a second one"},
    ]
    wait_settled(redis_client, "", session)  # its blocks reach Redis just after the answer
    r2 = _chat(celery_app, turn2, session, w2.queue)  # a worker that never saw this session
    assert r2.worker == w2.name
    assert list(r2.token_ids) == _continued(redis_client, session, r2, tiny_reference)
    # The shared system prompt may already sit in w2's pool; the rest of turn 1 came from Redis.
    assert r2.usage.redis_tokens > 0, r2.usage
    assert r2.usage.computed_tokens < r2.usage.prompt_tokens - r1.usage.prompt_tokens + BLOCK, r2.usage
    raw: Any = redis_client.get(keys.session("", session))
    assert raw is not None and b'"last_worker"' in raw and w2.name.encode() in raw


@pytest.mark.fp32_only(reason="each turn's tokens equal HF fp32 generate's")
def test_blocks_evicted_from_pool_and_warm_tier_reload_from_redis(
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    small = worker_factory(
        "small", "--cache-size", str(24 * BLOCK_BYTES), "--warm-cache-size", str(12 * BLOCK_BYTES)
    )
    session = f"evict-{uuid.uuid4().hex[:8]}"
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "remember this"}]
    r1 = _chat(celery_app, turn1, session, small.queue)
    for i, filler in enumerate(_conversation(6)):  # other traffic pushes turn 1 out of pool and warm tier
        filler[0]["content"] = f"filler system prompt {i} " * 12
        _chat(celery_app, filler, None, small.queue)
    turn2 = [*turn1, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "what was it?"}]
    r2 = _chat(celery_app, turn2, session, small.queue)
    assert list(r2.token_ids) == _continued(redis_client, session, r2, tiny_reference)
    assert r2.usage.redis_tokens > 0 and r2.usage.cached_tokens >= 4 * BLOCK, r2.usage


def _settled_packs(client: redis.Redis, quiet_s: float = 1.0, timeout_s: float = 30.0) -> list[bytes]:
    """The tier's pack keys once none has appeared for `quiet_s`."""
    deadline = time.monotonic() + timeout_s
    packs = sorted(client.scan_iter(match="kvferry:kv:pack:*"))
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = sorted(client.scan_iter(match="kvferry:kv:pack:*"))
        if now == packs:
            break
        packs = now
    return packs


@pytest.mark.fp32_only(reason="each turn's tokens equal HF fp32 generate's")
def test_corrupted_and_foreign_blocks_are_recomputed(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    w1, _ = two_workers
    turn1 = [{"role": "system", "content": "Corruption test. " * 20}, {"role": "user", "content": "hi"}]
    before = set(_settled_packs(redis_client))  # other tests' packs are left as they are
    _chat(celery_app, turn1, f"corrupt-{uuid.uuid4().hex[:8]}", w1.queue)
    packs = [k for k in _settled_packs(redis_client) if k not in before]  # the writer may still write
    assert packs, "no block packs in Redis"
    for i, key in enumerate(packs):
        if i % 2:  # runs of flipped bytes through every block of the pack: each checksum fails
            size = int(redis_client.strlen(key))
            for at in range(200, size, 1024):
                redis_client.setrange(key, at, b"\x00garbage\x00")
        else:
            redis_client.set(key, b"not msgpack at all")  # undecodable: dropped whole
    fresh = worker_factory("fresh")  # nothing in its pool or warm tier: everything from Redis or computed
    r = _chat(celery_app, turn1, None, fresh.queue)
    assert list(r.token_ids) == _expected(tokenizer, tiny_reference, turn1, 8)
    assert r.usage.redis_tokens == 0 and r.usage.computed_tokens == r.usage.prompt_tokens, r.usage


@pytest.mark.fp32_only(reason="each turn's tokens equal HF fp32 generate's")
def test_sessions_survive_redis_and_worker_restarts(
    worker_factory: Callable[..., WorkerProcess],
    tmp_path_factory: Any,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    from broker.celery_app import BrokerConfig, make_celery

    data = tmp_path_factory.mktemp("redis-aof")
    with RedisServer(data, persist=True) as server:
        app = make_celery(BrokerConfig(redis_url=server.url))
        worker = worker_factory("aof1", redis_url=server.url)
        session = f"aof-{uuid.uuid4().hex[:8]}"
        turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "persist me"}]
        r1 = _chat(app, turn1, session, worker.queue)
        worker.stop()
        server.stop()  # Redis goes down with the session and its blocks in the AOF
        server.start()  # same port, same data
        client = redis.Redis.from_url(server.url)
        wait_for(
            lambda: client.get(keys.session("", session)) is not None, 10, "the session after the restart"
        )
        worker = worker_factory("aof2", redis_url=server.url)  # every worker is new
        turn2 = [
            *turn1,
            {"role": "assistant", "content": r1.text},
            {"role": "user", "content": "still there?"},
        ]
        r2 = _chat(app, turn2, session, worker.queue)
        assert list(r2.token_ids) == _continued(client, session, r2, tiny_reference)
        assert (
            r2.usage.redis_tokens
            >= len(
                tokenizer.apply_chat_template(
                    turn1, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
            // BLOCK
            * BLOCK
            - BLOCK
        ), r2.usage
        worker.stop()


@pytest.mark.fp32_only(reason="the preloaded turn's tokens equal HF fp32 generate's")
def test_preload_pins_a_system_prompt_for_every_worker(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Any,
    celery_app: Any,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    import io

    from ops.queue_client import preload
    from ops.settings import Settings

    system = "Preloaded system prompt for everyone. " * 10
    templates = tmp_path / "templates.txt"
    templates.write_text(system + "\n")
    out = io.StringIO()
    assert preload(Settings(redis_url=redis_server.url, served_model_name=MODEL), templates, out) == 1
    assert "pinned" in out.getvalue(), out.getvalue()
    from kvstore.redis import pins as tier_pins
    from kvstore.redis.keys import PinOwner, TierKeys

    owner = PinOwner.preload("")  # the templates' pins belong to their tenant, not to a session
    assert (
        sum(redis_client.scard(TierKeys(fp).pinset(owner)) for fp in tier_pins.fingerprints(redis_client)) > 0
    )
    # Any worker now starts the prompt from the pinned blocks (its pool, or Redis).
    for worker in two_workers:
        turn = [{"role": "system", "content": system}, {"role": "user", "content": f"hi from {worker.name}"}]
        result = _chat(celery_app, turn, None, worker.queue)
        assert list(result.token_ids) == _expected(tokenizer, tiny_reference, turn, 8)
        assert result.usage.cached_tokens >= 4 * BLOCK, result.usage
