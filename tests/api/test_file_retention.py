"""Retention and quotas of files and batches against the real api (uvicorn, redis-server):
`expires_after` and the defaults in the File object and as Redis TTLs; an expired file is a 404
and the sweeper removes its contents, and orphans (crash leftovers, contents without a record),
but nothing a live batch or file still owns; ended batches' records get TTLs and their files the
output expiry; per-tenant quotas on files, bytes and open batches are 429s naming the limit."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
from openai import omit

from api.app import create_app
from api.batches.parts import output_part
from api.config import ApiConfig
from broker import keys
from tests.api.conftest import MODEL, Served, ServerThread
from tests.api.test_files import PAIRS, client, stored

DAY = 86400
ENDED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def api(serve: Callable[..., Served], rds: redis.Redis, tmp_path: Path) -> Served:
    return serve(api_keys=PAIRS, files_dir=tmp_path)


@pytest.fixture
def capped(serve: Callable[..., Served], rds: redis.Redis, tmp_path: Path) -> Served:
    quotas = {"tenant_max_files": 3, "tenant_max_file_bytes": 1000, "tenant_max_batches": 1}
    return serve(api_keys=PAIRS, files_dir=tmp_path, **quotas)


@contextlib.contextmanager
def own_api(private: tuple[redis.Redis, str], files_dir: Path, **fields: Any) -> Iterator[Served]:
    """An api of its own on a Redis no other app uses: its batch runner and file sweeper hold
    their leases (another app's, with another store, would not find this one's files)."""
    config = ApiConfig(
        redis_url=private[1], served_models=(MODEL,), api_keys=PAIRS, files_dir=files_dir, **fields
    )
    app = create_app(config)
    with ServerThread(app) as url:
        yield Served(app, url)


@pytest.fixture
def sweeping(private: tuple[redis.Redis, str], tmp_path: Path) -> Iterator[Served]:
    """Sweeping every 0.2 s what has been orphaned for a second."""
    with own_api(private, tmp_path / "files", files_sweep_interval_s=0.2, files_orphan_grace_s=1) as api:
        yield api


def requests(n: int) -> bytes:
    """A batch input the runner accepts (no worker runs it here: it stays in progress)."""
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    line = {"method": "POST", "url": "/v1/completions", "body": body}
    return b"".join(json.dumps({**line, "custom_id": f"r-{i}"}).encode() + b"\n" for i in range(n))


def upload(c: openai.OpenAI, data: bytes, purpose: Any = "user_data", **kwargs: Any) -> Any:
    return c.files.create(file=("f.jsonl", io.BytesIO(data)), purpose=purpose, **kwargs)


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def age(path: Path, seconds: float = 100) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_expires_after_and_the_defaults(api: Served, rds: redis.Redis) -> None:
    alice = client(api)
    chosen = upload(alice, b"x", expires_after={"anchor": "created_at", "seconds": 3600})
    assert chosen.expires_at == chosen.created_at + 3600
    assert 3590 < rds.ttl(keys.file_record(chosen.id)) <= 3600
    assert alice.files.retrieve(chosen.id).expires_at == chosen.expires_at
    batch = upload(alice, requests(1), "batch")  # OpenAI's default for purpose batch: 30 days
    assert batch.expires_at == batch.created_at + 30 * DAY
    assert 30 * DAY - 10 < rds.ttl(keys.file_record(batch.id)) <= 30 * DAY
    kept = upload(alice, b"y")
    assert kept.expires_at is None and rds.ttl(keys.file_record(kept.id)) == -1
    for bad in ({"anchor": "created_at", "seconds": 60}, {"anchor": "last_active_at", "seconds": 3600}):
        with pytest.raises(openai.BadRequestError) as caught:
            upload(alice, b"z", expires_after=bad)
        assert caught.value.param == "expires_after" and "3600" in caught.value.message
    assert len(alice.files.list().data) == 3


def test_an_expired_file_is_gone_and_the_sweeper_removes_orphans(
    sweeping: Served, private: tuple[redis.Redis, str], tmp_path: Path
) -> None:
    rds, root = private[0], tmp_path / "files"
    alice = client(sweeping)
    expiring = upload(alice, b"old", expires_after={"anchor": "created_at", "seconds": 3600})
    kept = upload(alice, b"kept")
    batch_input = upload(alice, requests(2), "batch")
    running = alice.batches.create(
        input_file_id=batch_input.id, endpoint="/v1/completions", completion_window="24h"
    )
    (root / output_part(running.id)).write_bytes(b"")  # a live batch's part: its runner appends here
    leftovers = {"file-orphan": root, "batch_gone.output.part": root, "file-cut.0a1b": root / ".tmp"}
    for name, directory in leftovers.items():
        (directory / name).write_bytes(b"left by a crash")
    (root / ".tmp" / "file-writing.2c3d").write_bytes(b"a write in progress")
    owned = [root / name for name in (expiring.id, kept.id, batch_input.id, output_part(running.id))]
    for path in (*owned, *(directory / name for name, directory in leftovers.items())):
        age(path)  # older than the grace: only ownership keeps a file now
    rds.delete(keys.file_record(batch_input.id))  # an input's record gone: the live batch still reads it
    # The hour passes: the record says it has expired (Redis drops the key at its TTL, a little later).
    rds.hset(keys.file_record(expiring.id), "expires_at", int(time.time()) - 1)
    for call in (alice.files.retrieve, alice.files.content):
        with pytest.raises(openai.NotFoundError):
            call(expiring.id)
    assert [f.id for f in alice.files.list().data] == [kept.id]
    gone = (expiring.id, "file-orphan", "batch_gone.output.part", "file-cut.0a1b")
    wait_for(lambda: not set(gone) & set(stored(root)), f"the sweeper to remove {gone}")
    assert sorted(stored(root)) == sorted(
        [kept.id, batch_input.id, output_part(running.id), "file-writing.2c3d"]
    )
    assert alice.files.content(kept.id).read() == b"kept"


def test_an_ended_batch_and_its_files_expire(private: tuple[redis.Redis, str], tmp_path: Path) -> None:
    rds = private[0]
    retention = {"batch_expiry_s": 1, "batch_retention_s": 1000, "batch_output_expiry_s": 5000}
    with own_api(private, tmp_path, **retention) as short:
        ended_batch_files_expire(short, rds)


def ended_yet(c: openai.OpenAI, batch_id: str) -> bool:
    return c.batches.retrieve(batch_id).status in ENDED


def ended_batch_files_expire(short: Served, rds: redis.Redis) -> None:
    alice = client(short)
    made = []
    for chosen in (omit, {"anchor": "created_at", "seconds": 7200}):
        made.append(
            alice.batches.create(
                input_file_id=upload(alice, requests(2), "batch").id,
                endpoint="/v1/completions",
                completion_window="24h",
                output_expires_after=chosen,  # type: ignore[arg-type]
            )
        )
    for batch, seconds in zip(made, (5000, 7200), strict=True):
        wait_for(partial(ended_yet, alice, batch.id), f"{batch.id} to end")
        ended = alice.batches.retrieve(batch.id)
        assert ended.status == "expired" and ended.error_file_id is not None
        assert 990 < rds.ttl(keys.batch_record(batch.id)) <= 1000
        errors = alice.files.retrieve(ended.error_file_id)
        assert errors.expires_at == errors.created_at + seconds
        assert seconds - 10 < rds.ttl(keys.file_record(errors.id)) <= seconds
    rds.delete(keys.batch_record(made[0].id))  # its retention runs out
    assert [b.id for b in alice.batches.list().data] == [made[1].id]
    assert rds.zcard(keys.tenant_batches("alice")) == 1  # out of the tenant's list too
    with pytest.raises(openai.BadRequestError) as caught:
        alice.batches.create(
            input_file_id=made[1].input_file_id,
            endpoint="/v1/completions",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 10},
        )
    assert caught.value.param == "output_expires_after.seconds"


def quota_error(caught: pytest.ExceptionInfo[openai.RateLimitError], code: str, *named: str) -> None:
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == code and body["type"] == "rate_limit_error"
    for word in named:
        assert word in body["message"], body


def test_file_quotas_are_429s_naming_the_limit(capped: Served, rds: redis.Redis, tmp_path: Path) -> None:
    alice, bob = client(capped), client(capped, "sk-bob")
    first = upload(alice, b"a" * 600)
    with pytest.raises(openai.RateLimitError) as caught:
        upload(alice, b"b" * 600)
    quota_error(caught, "tenant_bytes_limit", "1000 bytes", "KVFERRY_TENANT_MAX_FILE_BYTES")
    assert stored(tmp_path) == [first.id]  # the refused upload's contents are gone
    upload(alice, b"c" * 300)
    third = upload(alice, b"d")
    with pytest.raises(openai.RateLimitError) as caught:
        upload(alice, b"e")
    quota_error(caught, "tenant_file_limit", "3 files", "KVFERRY_TENANT_MAX_FILES")
    upload(bob, b"f" * 900)  # another tenant's quota
    alice.files.delete(third.id)
    upload(alice, b"g")
    rds.delete(keys.file_record(first.id))  # expired: Redis dropped its record at its TTL
    upload(alice, b"h" * 600)  # its files and bytes no longer count
    assert len(alice.files.list().data) == 3


def test_open_batches_are_capped_per_tenant(private: tuple[redis.Redis, str], tmp_path: Path) -> None:
    with own_api(private, tmp_path, tenant_max_batches=1) as capped:
        open_batches_capped(capped)


def open_batches_capped(capped: Served) -> None:
    alice, bob = client(capped), client(capped, "sk-bob")
    input_id = upload(alice, requests(1), "batch").id
    first = alice.batches.create(input_file_id=input_id, endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.RateLimitError) as caught:
        alice.batches.create(input_file_id=input_id, endpoint="/v1/completions", completion_window="24h")
    quota_error(caught, "tenant_batch_limit", "at most 1 batches", "KVFERRY_TENANT_MAX_BATCHES")
    bob_input = upload(bob, requests(1), "batch").id
    bob.batches.create(input_file_id=bob_input, endpoint="/v1/completions", completion_window="24h")
    alice.batches.cancel(first.id)
    wait_for(lambda: alice.batches.retrieve(first.id).status == "cancelled", "the cancel")
    alice.batches.create(input_file_id=input_id, endpoint="/v1/completions", completion_window="24h")


def test_settings_reach_the_api_config() -> None:
    from ops.settings import Settings
    from ops.stack.api_server import api_config

    default = api_config(Settings.from_env({}))
    assert (default.files_batch_expiry_s, default.batch_output_expiry_s, default.batch_retention_s) == (
        30 * DAY,
    ) * 3
    assert (default.tenant_max_files, default.tenant_max_file_bytes, default.tenant_max_batches) == (
        10000,
        100 * 2**30,
        100,
    )
    env = {
        "KVFERRY_TENANT_MAX_FILES": "5",
        "KVFERRY_TENANT_MAX_FILE_BYTES": "1G",
        "KVFERRY_TENANT_MAX_BATCHES": "0",
        "KVFERRY_FILES_BATCH_EXPIRY_S": "0",
        "KVFERRY_FILES_SWEEP_INTERVAL_S": "5",
        "KVFERRY_FILES_ORPHAN_GRACE_S": "60",
    }
    config = api_config(Settings.from_env(env))
    assert (config.tenant_max_files, config.tenant_max_file_bytes, config.tenant_max_batches) == (5, 2**30, 0)
    assert (config.files_batch_expiry_s, config.files_sweep_interval_s, config.files_orphan_grace_s) == (
        0,
        5.0,
        60,
    )
