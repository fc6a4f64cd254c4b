"""Prefetch hints: the router hints the worker it sends a session's turn to, when that is not the
session's last worker; the worker loads the session's blocks from Redis into its warm tier ahead
of the job, which then hits them even if Redis lost them meanwhile. Token-exact throughout."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from broker import keys
from broker.messages import ChatMessage, GenerateJob, SessionRecord
from broker.routing import prefetch_hint
from broker.routing.prefix_digest import chat_digests
from broker.sessions import store as session_store
from kvstore.redis.keys import PACK_PREFIX
from tests.api.test_router import _beat, _route, advertise
from tests.integration.conftest import WorkerProcess, wait_for
from tests.integration.hint_listeners import listeners, waiting_listeners
from tests.integration.test_session_tokens import _chat, _used_prompt

Reference = Callable[[list[int], int], list[int]]
SYSTEM = "Prefetch me ahead of the turn, block by block, from the shared tier. " * 6


def test_router_hints_the_worker_a_session_moves_to(redis_client: redis.Redis, redis_server: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    a, b = f"a-{tag}", f"b-{tag}"
    system = ChatMessage("system", f"be brief {tag}")
    job = GenerateJob(model="m", endpoint="chat", messages=(system,), session_id=f"s-{tag}")
    session_store.save(redis_client, SessionRecord(f"s-{tag}", "", "m", (1, 2), (), a, time.time(), 1), 60)
    _beat(redis_client, a)
    _beat(redis_client, b)
    assert _route(redis_server.url, job).reason == f"session affinity: {a}"
    assert redis_client.llen(keys.worker_prefetch(a)) == redis_client.llen(keys.worker_prefetch(b)) == 0
    _beat(redis_client, a, waiting=9)  # busy: the turn moves to b, which served the same prefix
    advertise(redis_client, b, chat_digests("m", "", (system,)))
    route = _route(redis_server.url, job)
    assert route.queue == keys.worker_queue(b), route
    raw: Any = redis_client.lpop(keys.worker_prefetch(b))
    assert prefetch_hint.decode(raw) == prefetch_hint.PrefetchHint("", f"s-{tag}", "")
    assert redis_client.ttl(keys.worker_prefetch(b)) in (-2, *range(1, prefetch_hint.HINT_TTL_S + 1))
    no_session = GenerateJob(model="m", endpoint="chat", messages=(system,))
    _route(redis_server.url, no_session)
    assert redis_client.llen(keys.worker_prefetch(b)) == 0


def test_hinted_worker_has_the_blocks_warm_before_the_job(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    w1, _ = two_workers
    fresh = worker_factory("hinted")
    session = f"hint-{uuid.uuid4().hex[:8]}"
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "turn one"}]
    r1 = _chat(celery_app, turn1, session, w1.queue)

    def written() -> bool:  # the record names the whole chain once turn 1's blocks are in Redis
        record = session_store.load(redis_client, "", session)
        return record is not None and len(record.block_hashes) == len(record.token_ids) // 16

    wait_for(written, 30, "turn 1's blocks to be written through")
    blocked = listeners(redis_client)
    hint = prefetch_hint.PrefetchHint("", session, "")
    redis_client.lpush(keys.worker_prefetch(fresh.name), prefetch_hint.encode(hint))
    wait_for(lambda: redis_client.llen(keys.worker_prefetch(fresh.name)) == 0, 10, "the hint to be taken")
    wait_for(lambda: waiting_listeners(redis_client) >= blocked, 30, "the hint's blocks to be loaded")
    packs = list(redis_client.scan_iter(match=f"{PACK_PREFIX}*"))
    assert packs, "turn 1's blocks were never written to the Redis tier"
    redis_client.delete(*packs)  # from here on only the hinted warm tier holds turn 1's blocks
    turn2 = [*turn1, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "turn two"}]
    r2 = _chat(celery_app, turn2, session, fresh.queue)
    prompt2 = _used_prompt(redis_client, session, r2)
    assert list(r2.token_ids) == tiny_reference(prompt2, 8)
    # Turn 1's last token has no KV until turn 2 computes it (a whole number of blocks ends in
    # one never written).
    turn1_blocks = (r1.usage.prompt_tokens + len(r1.token_ids) - 1) // 16
    assert r2.usage.cached_tokens >= turn1_blocks * 16, r2.usage
    assert r2.usage.pool_tokens == 0, r2.usage  # nothing was in its pool: all from the warm tier
