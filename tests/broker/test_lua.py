"""broker/redis/lua.py, the one wrapper of the api's and the broker's Lua scripts, against a real
Redis: a script file after its preludes (one from another folder), run by EVALSHA on a sync and
an asyncio client and queued on a pipeline, loaded again after a SCRIPT FLUSH (a Redis restart)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import keys
from broker.jobs import message_copy
from broker.jobs.message_copy import FORGET_COPY
from broker.redis.lua import Script
from ops.redis.server import RedisServer

# broker/jobs/lua/: a script of that folder, with the message copy's prelude before it
START = Script(message_copy.__file__, "lease_start", (FORGET_COPY,))


@dataclass(frozen=True, slots=True)
class Take:
    job_id: str

    def keys(self) -> list[str]:
        return [
            keys.job_lease(self.job_id),
            keys.job_epoch(self.job_id),
            "test:worker-jobs",
            *message_copy.copy_keys(self.job_id),
            keys.job_stream(self.job_id),
            keys.job_cancel(self.job_id),
        ]

    def args(self) -> list[Any]:
        return ["w|1", 1000, 60, self.job_id]


def _calls(rds: redis.Redis) -> dict[str, int]:
    stats = rds.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha")}


def test_a_script_runs_after_its_preludes_by_sha_and_again_after_a_flush(rds: redis.Redis) -> None:
    rds.set(keys.job_message("j"), b"{}")
    rds.zadd(keys.PENDING_JOBS, {"j": 1.0})
    assert START.text.index("local function forget_copy") < START.text.index("redis.call('SADD'")
    rds.script_flush()
    rds.config_resetstat()
    reply = START.run(rds, Take("j"))
    assert int(reply[0]) == 1 and int(reply[2]) == 1  # taken, epoch 1
    assert not rds.exists(keys.job_message("j")) and rds.zscore(keys.PENDING_JOBS, "j") is None
    rds.script_flush()  # as after a restart: the sha is unknown, the text is sent once
    assert int(START.run(rds, Take("k"))[0]) == 1
    assert int(START.run(rds, Take("l"))[0]) == 1  # loaded: one EVALSHA
    assert _calls(rds) == {"eval": 0, "evalsha": 5}  # each flush: a miss, then its retry


def test_the_same_script_on_an_asyncio_client_and_on_its_pipeline(redis_server: RedisServer) -> None:
    async def go() -> tuple[Any, list[Any]]:
        client = aioredis.Redis.from_url(redis_server.url)
        try:
            await client.flushall()
            await client.script_flush()
            alone = await START.run(client, Take("a"))
            pipe = client.pipeline(transaction=False)
            await START.run(pipe, Take("b"))
            pipe.get(keys.job_epoch("b"))
            return alone, list(await pipe.execute())
        finally:
            await client.aclose()

    alone, (queued, epoch) = asyncio.run(go())
    assert int(alone[0]) == 1 and int(queued[0]) == 1 and int(epoch) == 1
