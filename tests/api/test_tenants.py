"""Tenants at the edge: many keys (pairs and a reloadable file), each tenant's own jobs and job
cap (429 with Retry-After), routing that never tells of another tenant's prefix, per-tenant
metrics, and no prompt kept once a job is done."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from api.tenants import KeyRing, parse_entries, parse_file, parse_pairs, tenant_of
from broker import keys
from broker.messages import ChatMessage, GenerateJob
from broker.routing.prefix_digest import chat_digests
from ops.settings import Settings
from ops.stack.api_server import api_config
from tests.api.conftest import MODEL, Served
from tests.api.fake_worker import FakeWorker
from tests.api.test_ops import FIGURES, heartbeat
from tests.api.test_router import _route, advertise

PAIRS = (("sk-alice", "alice"), ("sk-bob", "bob"))
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
CHAT = {"model": MODEL, "messages": MSGS, "max_tokens": 3}
RELOAD_S = 0.1  # the keys file's check interval in these apis (KVFERRY_API_KEYS_RELOAD_S, 1 s by default)


def job(body: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"endpoint": "/v1/chat/completions", "body": body or CHAT}


def test_key_pairs_and_files_parse() -> None:
    assert parse_pairs("k1:alice, k:2:bob,") == (("k1", "alice"), ("k:2", "bob"))
    assert parse_file("# keys\nk1 alice  # first\n\nk2 bob\n", "f") == (("k1", "alice"), ("k2", "bob"))
    for bad in ("nokey", "k:", ":t", "k:a/b", "k k:t"):
        with pytest.raises(ValueError):
            parse_pairs(bad)
    with pytest.raises(ValueError):
        parse_file("k1 alice extra\n", "f")
    ring = KeyRing("solo", PAIRS, None)
    assert ring.tenant("sk-bob") == "bob" and ring.tenant("solo") == tenant_of("solo")
    assert ring.tenant("sk-bo") is None and ring.tenant("") is None
    assert not KeyRing(None, (), None).enabled


def test_keys_file_weights(tmp_path: Path) -> None:
    text = "k1 alice 2\nk2 bob\nk3 alice 2  # a second key, same weight\nk4 carol 0.5\n"
    pairs, weights = parse_entries(text, "f")
    assert [t for _, t in pairs] == ["alice", "bob", "alice", "carol"]
    assert weights == {"alice": 2.0, "bob": 1.0, "carol": 0.5}
    for bad in ("k1 alice 0\n", "k1 alice -1\n", "k1 alice x\n", "k1 alice inf\n", "k1 a 1\nk2 a 2\n"):
        with pytest.raises(ValueError):
            parse_entries(bad, "f")
    path = tmp_path / "keys"
    path.write_text(text)
    ring = KeyRing(None, (), path)
    assert ring.weight("alice") == 2.0 and ring.weight("bob") == 1.0 and ring.weight("nobody") == 1.0


def test_settings_reach_the_api_config(tmp_path: Path) -> None:
    env = {
        "KVFERRY_API_KEYS": "sk-a:alice,sk-b:bob",
        "KVFERRY_API_KEYS_FILE": str(tmp_path / "keys"),
        "KVFERRY_TENANT_MAX_JOBS": "3",
        "KVFERRY_DEFAULT_MAX_TOKENS": "256",
        "KVFERRY_DISPATCH_HEADROOM": "3",
        "KVFERRY_FAIR_QUOTA": "5",
        "KVFERRY_API_KEYS_RELOAD_S": "0.25",
        "KVFERRY_BATCH_LEASE_TTL_S": "2",
    }
    config = api_config(Settings.from_env(env))
    assert config.api_keys == (("sk-a", "alice"), ("sk-b", "bob"))
    assert config.api_keys_file == tmp_path / "keys"
    assert config.tenant_max_jobs == 3
    assert (config.dispatch_headroom, config.fair_quota) == (3, 5)
    assert (config.api_keys_reload_s, config.batch_lease_ttl_s) == (0.25, 2.0)
    assert Settings.from_env(env).engine_config().default_max_tokens == 256  # the worker applies it


def test_each_key_is_its_tenant_and_jobs_are_private(
    serve: Callable[..., Served], rds: redis.Redis, worker: FakeWorker
) -> None:
    api = serve(api_keys=PAIRS)
    with api.client() as c:
        assert c.post("/v1/chat/completions", json=CHAT, headers=ALICE).status_code == 200
        r = c.post("/v1/jobs", json=job(), headers=BOB)
        assert r.status_code == 202
        job_id = r.json()["id"]
        assert c.get(f"/v1/jobs/{job_id}", headers=ALICE).status_code == 404
        assert c.delete(f"/v1/jobs/{job_id}", headers=ALICE).status_code == 404
        assert c.get(f"/v1/jobs/{job_id}", headers=BOB).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer sk-carol"}).status_code == 401
    assert [s.job.tenant for s in worker.seen] == ["alice", "bob"]


def test_keys_file_is_reloaded_when_it_changes(
    serve: Callable[..., Served], rds: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-one one\n")
    api = serve(api_keys_file=path, api_keys_reload_s=RELOAD_S)
    with api.client() as c:
        assert c.get("/v1/models", headers={"Authorization": "Bearer sk-one"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer sk-two"}).status_code == 401
        path.write_text("# one is revoked\nsk-two two\n")
        later = time.time() + 5
        os.utime(path, (later, later))  # a new mtime even on a coarse clock
        time.sleep(2 * RELOAD_S)  # the file is looked at once a RELOAD_S at most
        assert c.get("/v1/models", headers={"Authorization": "Bearer sk-two"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer sk-one"}).status_code == 401


def test_a_deleted_keys_file_revokes_and_a_same_second_replace_is_noticed(
    serve: Callable[..., Served],
    rds: redis.Redis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ring_log = logging.getLogger("api.tenants")
    monkeypatch.setattr(ring_log, "disabled", False)  # whatever an earlier test's logging config did
    caplog.set_level(logging.WARNING, logger="api.tenants")
    path = tmp_path / "keys"
    path.write_text("sk-one one\n")
    api = serve(api_keys_file=path, api_keys_reload_s=RELOAD_S)

    def status(key: str) -> int:
        return c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code

    with api.client() as c:
        assert status("sk-one") == 200
        path.unlink()
        time.sleep(2 * RELOAD_S)  # the file is looked at once a RELOAD_S at most
        assert status("sk-one") == 401  # revoked, not kept until a restart
        assert "is gone" in caplog.text
        path.write_text("sk-one one\n")
        time.sleep(2 * RELOAD_S)
        assert status("sk-one") == 200  # back with the file
        stamp = path.stat()
        new = tmp_path / "keys.new"
        new.write_text("sk-two two\n")  # the same size, replaced by rename, its mtime the old one's
        os.utime(new, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        os.replace(new, path)
        time.sleep(2 * RELOAD_S)
        assert status("sk-two") == 200 and status("sk-one") == 401


def test_job_cap_is_per_tenant_429_with_retry_after(
    serve: Callable[..., Served], rds: redis.Redis, worker: FakeWorker
) -> None:
    api = serve(api_keys=PAIRS, tenant_max_jobs=2)
    worker.pause()
    with api.client() as c:
        ids = [c.post("/v1/jobs", json=job(), headers=ALICE).json()["id"] for _ in range(2)]
        over = c.post("/v1/jobs", json=job(), headers=ALICE)
        assert over.status_code == 429 and over.headers["retry-after"] == "1"
        assert over.json()["error"]["code"] == "tenant_job_limit"
        assert c.post("/v1/chat/completions", json=CHAT, headers=ALICE).status_code == 429
        assert c.post("/v1/jobs", json=job(), headers=BOB).status_code == 202  # bob has his own cap
        metrics = c.get("/metrics").text
        assert 'kvferry_tenant_jobs{tenant="alice"} 2.0' in metrics
        assert 'kvferry_tenant_jobs{tenant="bob"} 1.0' in metrics
        assert 'kvferry_tenant_jobs_rejected_total{tenant="alice"} 2.0' in metrics
        assert c.delete(f"/v1/jobs/{ids[0]}", headers=ALICE).status_code == 200  # a cancel frees a slot
        assert c.post("/v1/jobs", json=job(), headers=ALICE).status_code == 202
        assert c.post("/v1/jobs", json=job(), headers=ALICE).status_code == 429
        worker.resume()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the api sees the jobs end when they are polled
            if c.get(f"/v1/jobs/{ids[1]}", headers=ALICE).json()["status"] == "succeeded":
                break
            time.sleep(0.05)
        assert c.post("/v1/chat/completions", json=CHAT, headers=ALICE).status_code == 200
        c.get(f"/v1/jobs/{ids[1]}", headers=ALICE)  # seen twice: its tokens count once
        metrics = c.get("/metrics").text
    assert 'kvferry_tenant_prompt_tokens_total{tenant="alice"} 14.0' in metrics  # 2 jobs x 7
    assert 'kvferry_tenant_requests_total{tenant="bob"} 1.0' in metrics


def test_route_reason_never_tells_of_another_tenants_prefix(
    serve: Callable[..., Served], rds: redis.Redis, redis_url: str
) -> None:
    heartbeat(rds, "w1", FIGURES)
    messages = tuple(ChatMessage(m["role"], m["content"]) for m in MSGS)
    alice = GenerateJob(model=MODEL, endpoint="chat", messages=messages, tenant="alice")
    advertise(rds, "w1", chat_digests(MODEL, alice.kv_salt, messages))
    assert _route(redis_url, alice).reason.startswith("prefix match: 2/2 messages on w1")
    bob = GenerateJob(model=MODEL, endpoint="chat", messages=messages, tenant="bob")
    assert _route(redis_url, bob).reason == "shared: no worker holds this prefix"
    salted = GenerateJob(model=MODEL, endpoint="chat", messages=messages, tenant="alice", cache_salt="s")
    assert _route(redis_url, salted).reason == "shared: no worker holds this prefix"
    api = serve(api_keys=PAIRS)
    with api.client() as c:
        mine = c.post("/v1/jobs", json=job(), headers=ALICE).json()["route"]["reason"]
        theirs = c.post("/v1/jobs", json=job(), headers=BOB).json()["route"]["reason"]
        salt = c.post("/v1/jobs", json=job({**CHAT, "cache_salt": "s"}), headers=ALICE).json()
    assert mine.startswith("prefix match")
    assert "prefix" not in theirs.replace("no worker holds this prefix", "") and "w1" not in theirs
    assert "prefix match" not in salt["route"]["reason"]


def _values(client: redis.Redis) -> bytes:
    """Every value Redis holds, concatenated."""
    rds: Any = client  # redis-py's replies are typed bytes | str
    out: list[bytes] = []
    for key in rds.keys("*"):
        kind = rds.type(key).decode()
        if kind == "string":
            out.append(rds.get(key) or b"")
        elif kind == "hash":
            out += [k + v for k, v in rds.hgetall(key).items()]
        elif kind == "list":
            out += rds.lrange(key, 0, -1)
        elif kind == "set":
            out += list(rds.smembers(key))
        elif kind == "zset":
            out += rds.zrange(key, 0, -1)
        elif kind == "stream":
            out += [k + v for _, fields in rds.xrange(key) for k, v in fields.items()]
    return b"".join(out)


def test_no_prompt_is_kept_once_the_job_is_done(api: Served, rds: redis.Redis, worker: FakeWorker) -> None:
    secret = "zebra-quartz-17"
    body = {"model": MODEL, "messages": [{"role": "user", "content": secret}], "max_tokens": 3}
    with api.client() as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        job_id = r.headers["x-job-id"]
        view = c.get(f"/v1/jobs/{job_id}").json()
    assert view["status"] == "succeeded" and view["result"]["choices"][0]["message"]["content"]
    assert rds.exists(keys.job_meta(job_id))
    assert secret.encode() not in _values(rds)
    assert rds.zcard(keys.tenant_jobs("")) == 0  # the job no longer counts against its tenant


def test_preload_takes_a_tenant(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from click.testing import CliRunner

    import ops.queue_client
    from ops.cli.service import preload_cmd

    seen: list[str] = []

    def fake_preload(settings: Settings, path: Path, out: Any, tenant: str = "") -> int:
        seen.append(tenant)
        return 1

    monkeypatch.setattr(ops.queue_client, "preload", fake_preload)
    templates = tmp_path / "t.txt"
    templates.write_text("You are helpful.\n")
    result = CliRunner().invoke(preload_cmd, [str(templates), "--tenant", "alice"])
    assert result.exit_code == 0, result.output
    assert seen == ["alice"]
