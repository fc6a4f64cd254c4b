"""A tier write that Redis refuses over its maxmemory (OOM, with no key it may evict: the memory
is held by a slow reader's replies) is sent once more after a pause, and lands whole; refused
twice, it raises and nothing of it is stored. Real redis-server, real output buffers."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kvstore.layout import KVFormat
from kvstore.redis.tier import RedisTier
from ops.redis.server import RedisServer
from tests.kvstore.conftest import MakeBlocks

MAXMEMORY = 4 * 1024**2
VALUE = 1024**2
REPLIES = 24  # 24 MB of replies unread: far past maxmemory, whatever the kernel's buffers hold


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "kv", maxmemory_bytes=MAXMEMORY, policy="volatile-lru") as server:
        yield server


class SlowReader:
    """A client that asked for REPLIES copies of a 1 MB value and reads none yet: Redis holds
    what the socket cannot take in its output buffer, which counts against maxmemory."""

    def __init__(self, server: RedisServer, client: redis.Redis) -> None:
        client.set("big", b"x" * VALUE)  # no TTL: volatile-lru may not evict it
        self.sock = socket.create_connection(("127.0.0.1", server.port))
        self.sock.sendall(b"GET big\r\n" * REPLIES)
        self.expected = REPLIES * (len(f"${VALUE}\r\n") + VALUE + 2)
        self.drained = 0
        deadline = time.monotonic() + 10
        while not _over_maxmemory(client):  # until Redis has read the GETs and queued the replies
            assert time.monotonic() < deadline, "the unread replies never filled Redis"
            time.sleep(0.01)

    def drain(self) -> None:
        while self.drained < self.expected:
            chunk = self.sock.recv(1 << 20)
            assert chunk, "redis closed the slow reader"
            self.drained += len(chunk)

    def close(self) -> None:
        self.sock.close()


def _over_maxmemory(client: redis.Redis) -> bool:
    return int(client.info("memory")["used_memory"]) > MAXMEMORY


@pytest.fixture
def full(capped: RedisServer, tiny_fmt: KVFormat) -> Iterator[tuple[redis.Redis, RedisTier, SlowReader]]:
    """A tier over a Redis that a slow reader has filled past its maxmemory."""
    client = redis.Redis.from_url(capped.url)
    reader = SlowReader(capped, client)
    try:
        yield client, RedisTier(client, tiny_fmt, 64 * 1024**2), reader
    finally:
        reader.close()


def test_a_write_refused_over_maxmemory_lands_on_the_second_try(
    full: tuple[redis.Redis, RedisTier, SlowReader], make_blocks: MakeBlocks
) -> None:
    _, tier, reader = full
    tier.oom_pause = reader.drain  # the pause during which the slow reader catches up
    blocks = make_blocks(6)
    assert tier.put(blocks) == 6
    assert reader.drained == reader.expected  # the first try was refused: the pause ran
    assert tier.stats().write_oom_retries == 1
    got = tier.get_run([b.block_hash for b in blocks], [b.token_ids for b in blocks])
    assert [bytes(b.kv) for b in got] == [bytes(b.kv) for b in blocks]


def test_a_write_refused_twice_raises_and_stores_nothing(
    full: tuple[redis.Redis, RedisTier, SlowReader], make_blocks: MakeBlocks
) -> None:
    client, tier, reader = full
    tier.oom_pause = lambda: None  # the reader stays behind: Redis is still full
    blocks = make_blocks(3)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        tier.put(blocks)
    assert tier.stats().write_oom_retries == 1
    reader.drain()
    assert not _over_maxmemory(client)
    assert tier.get_run([b.block_hash for b in blocks]) == []
    assert tier.stats().bytes_stored == 0


EXEC_REFUSED = "Transaction discarded because of: OOM command not allowed when used memory > 'maxmemory'."


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (redis.exceptions.ExecAbortError(EXEC_REFUSED), True),
        (redis.exceptions.ExecAbortError("WRONGTYPE"), False),
    ],
    ids=["exec-refused-over-maxmemory", "other-abort"],
)
def test_an_exec_refused_over_maxmemory_is_sent_again_and_no_other_abort_is(
    redis_client: redis.Redis,
    tiny_fmt: KVFormat,
    make_blocks: MakeBlocks,
    error: redis.exceptions.ExecAbortError,
    retried: bool,
) -> None:
    """When memory goes over between queueing and EXEC, Redis refuses the EXEC itself (redis-py:
    ExecAbortError naming OOM); the transaction is then stood in for by one that raises that once."""
    tier = RedisTier(redis_client, tiny_fmt, 64 * 1024**2)
    send, calls = tier._tx.send, []

    def refused_once(*args: Any) -> list[Any]:
        calls.append(args)
        if len(calls) == 1:
            raise error
        return send(*args)

    tier._tx.send = refused_once  # type: ignore[method-assign]
    tier.oom_pause = lambda: None
    blocks = make_blocks(3)
    if retried:
        assert tier.put(blocks) == 3
        assert tier.get_run([b.block_hash for b in blocks]) != []
    else:
        with pytest.raises(redis.exceptions.ExecAbortError):
            tier.put(blocks)
    assert (len(calls), tier.stats().write_oom_retries) == ((2, 1) if retried else (1, 0))
