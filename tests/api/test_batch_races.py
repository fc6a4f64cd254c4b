"""The batch runner's races and faults, forced by hand against a real redis-server and a fake
worker (tests/api/batch_rig.py): two runners overlapping on one batch across a lapsed lease, a
second finalize, an input file gone mid-batch, a cancel racing an expiry, a batch that fails
every pass."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from api.batches import state
from api.batches.run.finalize import finalize
from api.batches.run.runner import BatchRunner
from api.context import ApiContext
from api.files import records as file_records
from broker import keys
from broker.celery_app import BrokerConfig, make_celery
from tests.api.batch_rig import context, create, file_lines, line, load, parts_left, passes
from tests.api.fake_worker import FakeWorker


@pytest.fixture
def rig(private: tuple[redis.Redis, str], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """rig(body, window): body(ctx, rds, other) run with a fake worker on the private
    redis-server, a live worker heartbeat saying `window` seats; `other`: a second api's context
    (its own clients and metrics, as another replica)."""
    rds, url = private
    worker = FakeWorker(url, make_celery(BrokerConfig(redis_url=url))).start()

    def run(body: Callable[[ApiContext, redis.Redis, ApiContext], Awaitable[None]], window: int = 8) -> None:
        from tests.api.batch_rig import beat

        beat(rds, window)

        async def go() -> None:
            ctx, other = context(url, tmp_path / "files"), context(url, tmp_path / "files")
            try:
                await body(ctx, rds, other)
            finally:
                await ctx.jobs.close()
                await other.jobs.close()

        asyncio.run(go())

    yield run
    worker.stop()


def _snapshot(rds: redis.Redis, batch_id: str, tenant: str) -> tuple[Any, ...]:
    return rds.hgetall(keys.batch_record(batch_id)), rds.zrange(keys.tenant_files(tenant), 0, -1)


def test_a_runner_that_lost_its_lease_mid_finalize_writes_nothing(
    rig: Callable[..., Any], tmp_path: Path
) -> None:
    """Runner A marks the batch finalizing and stalls past its lease; B takes the lease and reads
    `finalizing`; A then finishes its finalize: fenced, it writes nothing. B completes the batch;
    B's second finalize (on what it read before) changes nothing: no empty files, no nulled ids."""

    async def body(ctx: ApiContext, rds: redis.Redis, other: ApiContext) -> None:
        a, b = BatchRunner(ctx, "api-a"), BatchRunner(other, "api-b")
        bid = await create(ctx, "alice", [line(f"c{i}") for i in range(6)])

        async def fed_all() -> bool:
            return (await load(ctx, bid)).fed_all

        await passes(a, fed_all)
        jobs = [j for text in (await state.running(ctx.jobs.redis, bid)).values() for j in eval_jobs(text)]
        deadline = time.monotonic() + 10
        while not all(rds.exists(keys.job_end(j)) for j in jobs):  # every line answered by the worker
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        rec = await load(ctx, bid)
        await a.collector.collect(a.lease.fence, rec)  # A's step, up to its finalize
        assert await state.transition(a.lease.fence, bid, "finalizing", int(time.time()), "in_progress")
        assert parts_left(tmp_path / "files"), "the answers wait in the part files"

        rds.pexpire(keys.BATCH_RUNNER_LEASE, 1)  # A stalls past its lease
        await asyncio.sleep(0.05)
        assert await b.lease.hold() and b.lease.epoch == a.lease.epoch + 1
        read_by_b = await load(ctx, bid)
        assert read_by_b.status == "finalizing"
        before = _snapshot(rds, bid, "alice")
        with pytest.raises(state.LeaseLost):
            await finalize(ctx, a.lease.fence, rec, "completed", "finalizing")  # A wakes up
        assert _snapshot(rds, bid, "alice") == before, "a runner that lost its lease wrote nothing"
        assert parts_left(tmp_path / "files"), "nor removed the parts"

        await b.run_pass()  # B finalizes what it read
        done = await load(ctx, bid)
        assert done.status == "completed" and (done.completed, done.failed) == (6, 0)
        out = file_lines(ctx, done.output_file_id)
        assert sorted(x["custom_id"] for x in out) == [f"c{i}" for i in range(6)]
        assert not parts_left(tmp_path / "files")

        after = _snapshot(rds, bid, "alice")
        stored = sorted(p.name for p in (tmp_path / "files").iterdir())
        assert not await finalize(ctx, b.lease.fence, read_by_b, "completed", "finalizing")
        assert _snapshot(rds, bid, "alice") == after, "a second finalize changes nothing"
        assert sorted(p.name for p in (tmp_path / "files").iterdir()) == stored
        assert file_lines(ctx, done.output_file_id) == out

    rig(body)


def eval_jobs(text: str) -> list[str]:
    from api.batches.run.feeder import Running

    return Running.from_json(text).jobs


def test_an_input_file_gone_mid_batch_fails_that_batch_alone(rig: Callable[..., Any], tmp_path: Path) -> None:
    """One seat: alice's batch (3 good lines, then many bad ones: each an error line at once) feeds
    a line a pass. Its input file vanishes with nothing of it running and lines still to feed: it
    fails, its finished lines in its output and error files, its parts removed; bob's batch,
    created after, still runs to completion (it once waited behind alice's failing feed)."""

    async def body(ctx: ApiContext, rds: redis.Redis, _: ApiContext) -> None:
        runner = BatchRunner(ctx, "api-a")
        bad = [line(f"x{i}", max_tokens=-1) for i in range(60)]
        doomed = await create(ctx, "alice", [line(f"a{i}") for i in range(3)] + bad)

        async def good_done() -> bool:
            return (await load(ctx, doomed)).completed == 3

        await passes(runner, good_done)
        rec = await load(ctx, doomed)
        assert not rec.fed_all, "lines still to feed when the file goes"
        assert not rds.hlen(keys.batch_running(doomed)), "nothing of it running"
        ctx.files.delete(rec.input_file_id)  # a crash, an operator, an expiry
        other = await create(ctx, "bob", [line(f"b{i}") for i in range(4)])

        async def both_ended() -> bool:
            return (await load(ctx, doomed)).ended and (await load(ctx, other)).ended

        await passes(runner, both_ended, timeout_s=15)
        failed, completed = await load(ctx, doomed), await load(ctx, other)
        assert completed.status == "completed" and completed.completed == 4
        assert failed.status == "failed" and failed.errors[0]["code"] == "file_not_found"
        delivered = [x["custom_id"] for x in file_lines(ctx, failed.output_file_id)]
        assert sorted(delivered) == ["a0", "a1", "a2"] and failed.completed == 3
        refused = [x["custom_id"] for x in file_lines(ctx, failed.error_file_id)]
        assert refused and failed.failed == len(refused) and set(refused) <= {f"x{i}" for i in range(60)}
        assert not parts_left(tmp_path / "files")
        assert not rds.zscore(keys.BATCHES_ACTIVE, doomed)

    rig(body, window=1)


def test_a_cancel_racing_an_expiry_lists_no_file_without_content(rig: Callable[..., Any]) -> None:
    """The runner reads a batch due to expire; a cancel lands before its finalize: the expiry's
    finalize ends nothing and lists nothing; the cancel's end lists only files that exist."""

    async def body(ctx: ApiContext, rds: redis.Redis, _: ApiContext) -> None:
        runner = BatchRunner(ctx, "api-a")
        bid = await create(ctx, "alice", [line("s", "SILENT")] + [line(f"a{i}") for i in range(3)])

        async def three_done() -> bool:
            return (await load(ctx, bid)).completed == 3

        await passes(runner, three_done)
        read = await load(ctx, bid)  # the runner's read: in_progress, and (say) due to expire
        assert await state.cancel(ctx.jobs.redis, bid, int(time.time()))  # the client's cancel
        assert not await finalize(ctx, runner.lease.fence, read, "expired", "validating", "in_progress")
        outputs, _more = await file_records.list_files(ctx.jobs.redis, "alice", purpose="batch_output")
        assert not outputs, "the expiry listed no file"

        async def ended() -> bool:
            return (await load(ctx, bid)).ended

        await passes(runner, ended, timeout_s=10)
        done = await load(ctx, bid)
        assert done.status == "cancelled" and done.completed == 3
        listed, _more = await file_records.list_files(ctx.jobs.redis, "alice", purpose="batch_output")
        assert {f.id for f in listed} == {done.output_file_id} | ({done.error_file_id} - {""})
        for f in listed:
            with ctx.files.open(f.id) as content:
                assert len(content.read()) == f.bytes

    rig(body)


def test_a_batch_failing_every_pass_backs_off_and_holds_no_other_up(
    rig: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A batch whose running line is unreadable fails every pass: it is skipped for a doubling
    while (a warning each time, not every 100 ms); another batch completes meanwhile."""

    async def body(ctx: ApiContext, rds: redis.Redis, _: ApiContext) -> None:
        runner = BatchRunner(ctx, "api-a")
        broken = await create(ctx, "alice", [line("x")])
        rds.hset(keys.batch_record(broken), mapping={"status": "in_progress", "fed_all": "1"})
        rds.hset(keys.batch_running(broken), "1", "not json")
        other = await create(ctx, "bob", [line(f"b{i}") for i in range(3)])
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="api.batches.run.runner"):

            async def other_done() -> bool:
                return (await load(ctx, other)).ended and time.monotonic() - started > 1.5

            await passes(runner, other_done)
        assert (await load(ctx, other)).status == "completed"
        warned = [r for r in caplog.records if broken in r.getMessage()]
        assert 1 <= len(warned) <= 2, [r.getMessage() for r in warned]  # 1.5 s: at t=0 and t=1 s

    rig(body)
