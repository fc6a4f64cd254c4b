"""`kvferry serve`'s stack is secure by default: two Redis with generated passwords (the queue's
never evicts and persists; the KV cache's is capped and evicts only packs), Flower behind basic
auth, every URL and secret in a 0600 stack.json and on no command line."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest
import redis

from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import KV_EVICTION_POLICY, Stack, kv_maxmemory, redact

KEYS = {"api_url", "redis_url", "kv_redis_url", "flower_url", "flower_user", "flower_password"}


def _config(client: redis.Redis, name: str) -> str:
    return str(client.config_get(name)[name])


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_stack_is_secure_by_default(tmp_path: Path) -> None:
    settings = Settings(
        model="tiny",
        cache_dir=tmp_path / "cache",
        api_port=free_port(),
        flower_port=free_port(),
        redis_cache_size="32M",
    )
    run_dir = tmp_path / "run"
    # No workers: this checks the stack's parts, not the engine (test_flower.py has workers).
    with Stack(settings, 0, run_dir=run_dir) as stack:
        stack.wait_ready(60)
        path = run_dir / "stack.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        info = json.loads(path.read_text())
        assert set(info) >= KEYS, sorted(info)
        assert info["api_url"] == stack.api_url and info["flower_url"] == stack.flower_url

        queue = redis.Redis.from_url(info["redis_url"], decode_responses=True)
        kv = redis.Redis.from_url(info["kv_redis_url"], decode_responses=True)
        assert info["redis_url"] != info["kv_redis_url"]
        for url, client in ((info["redis_url"], queue), (info["kv_redis_url"], kv)):
            assert client.ping()
            password = client.connection_pool.connection_kwargs["password"]
            assert password and len(password) >= 24
            with pytest.raises(redis.AuthenticationError):
                redis.Redis.from_url(url.replace(f":{password}@", "")).ping()
        assert _config(queue, "maxmemory-policy") == "noeviction"
        assert _config(queue, "appendonly") == "yes"
        assert _config(kv, "maxmemory") == str(kv_maxmemory(32 * 1024**2))
        assert _config(kv, "maxmemory-policy") == KV_EVICTION_POLICY
        assert (_config(kv, "appendonly"), _config(kv, "save")) == ("no", "")

        # Flower's API (it can revoke tasks, shut workers down) needs the generated credentials.
        api = f"{info['flower_url']}/api/workers"
        assert httpx.get(api, timeout=10).status_code == 401
        assert httpx.get(api, auth=(info["flower_user"], "wrong"), timeout=10).status_code == 401
        assert (
            httpx.get(api, auth=(info["flower_user"], info["flower_password"]), timeout=10).status_code == 200
        )
        assert httpx.get(f"{info['api_url']}/healthz", timeout=10).status_code == 200

        # The secrets are in stack.json only: not in the banner, nor on any command line (`ps`).
        secrets = [
            info["flower_password"],
            *(c.connection_pool.connection_kwargs["password"] for c in (queue, kv)),
        ]
        pids = [c.pid for c in stack.children.values()]
        pids += [s.process.pid for s in stack.redis_servers if s.process]
        assert len(pids) == 4  # api, flower, two redis
        exposed = [stack.banner(), *(_cmdline(pid) for pid in pids)]
        assert not [s for s in secrets for text in exposed if s in text]
    assert not path.exists()  # stale secrets of stopped servers are not left behind


def test_redact() -> None:
    assert redact("redis://:s3cr-t_@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert redact("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_a_given_redis_url_is_used_for_both(tmp_path: Path) -> None:
    stack = Stack(Settings(redis_url="redis://example:1/0", cache_dir=tmp_path), 0, run_dir=tmp_path)
    stack._start_redis()
    assert stack.redis_servers == []
    assert stack.settings.kv_redis_url == "redis://example:1/0"
