"""Two tenants through the real API and workers: sessions are scoped by tenant (GET, DELETE and a
turn under another tenant's session id never reach the owner's record or pins), and a session's
pins balance after chain edits, deletes, races and expiry (`kvferry stats --json`: orphan_pins 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from broker import keys
from broker.sessions import store as session_store
from kvstore.redis import pins as tier_pins
from kvstore.redis.keys import PinOwner, TierKeys
from kvstore.redis.report import read_report
from ops.redis.server import RedisServer, free_port
from tests.integration.conftest import MODEL, ROOT, WorkerProcess, tiny_block_bytes, wait_for
from tests.integration.jobs import wait_settled

SYSTEM = "You are a patient assistant who answers every question in full sentences. " * 4
BLOCK_BYTES = tiny_block_bytes()  # in the run's KV dtype (fp32 unless KVFERRY_TEST_* say otherwise)
ALICE, BOB = "key-alice", "key-bob"


@pytest.fixture(scope="module")
def tenant_api(
    redis_server: RedisServer, two_workers: tuple[WorkerProcess, WorkerProcess], tmp_path_factory: Any
) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("tenant-api") / "api.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KVFERRY_API_KEYS": f"{ALICE}:alice,{BOB}:bob"}
    args = [sys.executable, "-m", "ops.cli.main", "api", "--port", str(port), "--redis-url", redis_server.url]
    process = subprocess.Popen(
        [*args, "--model", MODEL], cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"api exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 30, "the api")
    yield url
    process.terminate()
    process.wait(10)


def _chat(url: str, key: str, session: str, user: str) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "session_id": session,
    }
    return httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


def _session(url: str, key: str, session: str, method: str = "GET") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.request(method, f"{url}/v1/sessions/{session}", headers=headers, timeout=10)


def _pins(client: redis.Redis, tenant: str, session: str) -> set[bytes]:
    owner = PinOwner.session(tenant, session)
    found: set[bytes] = set()
    for fp in tier_pins.fingerprints(client):
        found |= set(client.smembers(TierKeys(fp).pinset(owner)))  # type: ignore[arg-type]
    return found


def _chain(client: redis.Redis, tenant: str, session: str) -> set[bytes]:
    record = session_store.load(client, tenant, session)
    assert record is not None
    return {bytes.fromhex(h) for h in record.block_hashes}


def _assert_balanced(client: redis.Redis, live: dict[str, list[str]]) -> dict[str, Any]:
    """Every live session's pins lie on its current chain; the tenants' bytes are exactly theirs."""
    report = read_report(client, client)
    assert report["orphan_pins"] == 0 and report["pending_pins"] == 0, report
    expected = {}
    for tenant, sessions in live.items():
        total = 0
        for session in sessions:
            pins = _pins(client, tenant, session)
            assert pins and pins <= _chain(client, tenant, session)
            total += len(pins) * BLOCK_BYTES
        if total:
            expected[tenant] = total
    mine = {t: n for t, n in report["pinned_bytes_by_tenant"].items() if t in ("alice", "bob")}
    assert mine == expected, report  # (other tests' sessions may pin under other tenants)
    return report


def test_sessions_are_per_tenant_and_pins_balance(tenant_api: str, redis_client: redis.Redis) -> None:
    sid = f"shared-{uuid.uuid4().hex[:8]}"
    first = _chat(tenant_api, ALICE, sid, "alice asks about the weather in a long question " * 3)
    assert first.status_code == 200, first.text
    wait_settled(redis_client, "alice", sid)  # the record and pins follow just after the answer
    alice_raw = redis_client.get(keys.session("alice", sid))
    alice_pins = _pins(redis_client, "alice", sid)
    assert alice_raw is not None and alice_pins

    # Bob, with Alice's session id: 404 for GET and DELETE; his turn is a session of his own.
    assert _session(tenant_api, BOB, sid).status_code == 404
    assert _session(tenant_api, BOB, sid, "DELETE").status_code == 404
    assert _chat(tenant_api, BOB, sid, "bob overwrites nothing of alice's " * 4).status_code == 200
    wait_settled(redis_client, "bob", sid)
    assert redis_client.get(keys.session("alice", sid)) == alice_raw
    assert _pins(redis_client, "alice", sid) == alice_pins
    mine = _session(tenant_api, ALICE, sid)
    assert mine.status_code == 200 and mine.json()["turns"] == 1
    assert _session(tenant_api, BOB, sid).json()["turns"] == 1
    _assert_balanced(redis_client, {"alice": [sid], "bob": [sid]})

    # Alice edits history: the blocks of her old question leave the pins.
    edited = _chat(tenant_api, ALICE, sid, "alice rewrote her question entirely, now about trains " * 3)
    assert edited.status_code == 200
    wait_settled(redis_client, "alice", sid)
    assert _pins(redis_client, "alice", sid) != alice_pins
    _assert_balanced(redis_client, {"alice": [sid], "bob": [sid]})

    # Two turns of Bob's session at once: the pins are the chain of the record that stands.
    with ThreadPoolExecutor(2) as pool:
        turns = [
            pool.submit(_chat, tenant_api, BOB, sid, f"race {i}: a question long enough " * 4) for i in (1, 2)
        ]
        assert all(t.result().status_code == 200 for t in turns)
    wait_settled(redis_client, "bob", sid)
    _assert_balanced(redis_client, {"alice": [sid], "bob": [sid]})

    # DELETE forgets at once; the workers' sweep releases her pins; Bob's are untouched.
    bob_pins = _pins(redis_client, "bob", sid)
    assert _pins(redis_client, "alice", sid)
    gone = _session(tenant_api, ALICE, sid, "DELETE")
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert _session(tenant_api, ALICE, sid).status_code == 404
    wait_for(lambda: not _pins(redis_client, "alice", sid), 10, "the sweep of alice's deleted session")
    assert _pins(redis_client, "bob", sid) == bob_pins
    wait_for(lambda: redis_client.exists(keys.session("alice", sid)) == 0, 10, "the sweep of alice's session")
    _assert_balanced(redis_client, {"bob": [sid]})

    # Expiry: the workers' sweep releases Bob's pins.
    redis_client.zadd(keys.SESSION_EXPIRY, {keys.session_member("bob", sid): time.time() - 1}, xx=True)
    wait_for(lambda: not _pins(redis_client, "bob", sid), 10, "the sweep of bob's expired session")
    report = _stats_json(redis_client)
    assert report["orphan_pins"] == 0 and "alice" not in report["pinned_bytes_by_tenant"]
    assert "bob" not in report["pinned_bytes_by_tenant"]
    assert report["hits"] + report["misses"] >= 0 and report["bytes_written"] > 0


def _stats_json(client: redis.Redis) -> dict[str, Any]:
    url = "redis://{host}:{port}/0".format(**client.connection_pool.connection_kwargs)
    out = subprocess.run(
        [sys.executable, "-m", "ops.cli.main", "stats", "--json", "--redis-url", url],
        cwd=Path(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    tier = json.loads(out.stdout)["redis_tier"]
    assert set(tier) >= {
        "pinned_bytes_by_tenant",
        "orphan_pins",
        "hits",
        "misses",
        "bytes_read",
        "bytes_written",
    }
    return dict(tier)


def test_quota_takes_only_the_tenants_own_least_recent_pins(
    worker_factory: Any, celery_app: Any, redis_client: redis.Redis
) -> None:
    from broker.codec import decode_result, encode_job
    from broker.messages import ChatMessage, GenerateJob
    from broker.sampling import SamplingParams

    quota = 15 * BLOCK_BYTES
    worker = worker_factory("quota", "--tenant-kv-quota", str(quota))
    tag = uuid.uuid4().hex[:6]

    def turn(tenant: str, session: str) -> None:
        job = GenerateJob(
            model=MODEL,
            endpoint="chat",
            messages=(ChatMessage("system", SYSTEM), ChatMessage("user", f"{session}: tell me more " * 3)),
            params=SamplingParams(max_tokens=4, ignore_eos=True),
            session_id=session,
            tenant=tenant,
            submitted_at=time.time(),
        )
        handle = celery_app.send_task(
            keys.GENERATE_TASK, args=[encode_job(job)], task_id=str(uuid.uuid4()), queue=worker.queue
        )
        decode_result(handle.get(timeout=120))
        wait_settled(redis_client, tenant, session)  # pinned in the order the turns ran

    turn("bob-q", f"b1-{tag}")
    for n in (1, 2, 3):
        turn("alice-q", f"a{n}-{tag}")
    by_tenant = read_report(redis_client, redis_client)["pinned_bytes_by_tenant"]
    assert 0 < by_tenant["alice-q"] <= quota
    assert _pins(redis_client, "alice-q", f"a1-{tag}") == set()  # the least recent went first
    assert _pins(redis_client, "alice-q", f"a3-{tag}")
    assert _pins(redis_client, "bob-q", f"b1-{tag}")  # bob is the oldest of all, and untouched
    for tenant, session in (("bob-q", f"b1-{tag}"), *(("alice-q", f"a{n}-{tag}") for n in (1, 2, 3))):
        session_store.delete(redis_client, tenant, session)
        tier_pins.release_session(redis_client, tenant, session)
