"""The api's Lua scripts (tenant job admission and end, the fleet's heartbeats) go through redis-py's
register_script: EVALSHA on each call, the text sent only when Redis lacks it."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from api.jobs import submit_write
from broker import keys
from broker.jobs import delivery
from tests.api.conftest import MODEL, Served
from tests.api.fake_worker import FakeWorker
from tests.api.test_ops import heartbeat


def _calls(rds: redis.Redis) -> dict[str, int]:
    stats = rds.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha")}


def test_the_api_runs_its_scripts_by_sha(api: Served, rds: redis.Redis, worker: FakeWorker) -> None:
    heartbeat(rds, "w1@h", None)
    rds.config_resetstat()
    with api.client() as c:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert c.post("/v1/chat/completions", json=chat).status_code == 200  # admitted, finished
        assert c.get("/healthz").json()["workers"] == 1  # the fleet's heartbeats
    calls = _calls(rds)
    assert calls["eval"] == 0 and calls["evalsha"] > 0, calls


def test_a_job_is_written_when_its_script_vanished_between_the_check_and_the_run(
    private_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline checks its scripts once (SCRIPT EXISTS), then runs; under Sentinel the check
    can be answered by the old primary and the run land on the new one, which never loaded the
    script (seen in tests/integration/test_sentinel_failover.py as a 503). Here the script is
    flushed right after the first check says it is there: the job is still written, once."""
    job_id = "noscript-job"

    async def go() -> None:
        client = aioredis.Redis.from_url(private_url)
        await client.script_load(submit_write.SUBMIT.text)
        checks: list[bool] = []
        check = Pipeline.load_scripts

        async def stale_check(pipe: Pipeline) -> None:
            await check(pipe)
            if not checks:  # the first check saw the script: it goes before the run
                await client.script_flush()
            checks.append(True)

        monkeypatch.setattr(Pipeline, "load_scripts", stale_check)
        record = delivery.Delivery("tag-1", "kvferry:test:queue", time.time())
        written = await submit_write.write_job(
            client,
            submit_write.JobWrite(
                job_id,
                {"status": "queued"},
                "{}",
                record.queue,
                "payload",
                record,
                60,
                time.time(),
            ),
        )
        assert not written.parked and len(checks) == 2
        assert await client.hget(keys.job_meta(job_id), "status") == b"queued"
        assert await client.llen(record.queue) == 1  # queued once
        await client.aclose()

    asyncio.run(go())
