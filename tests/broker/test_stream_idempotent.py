"""The fenced stream append is idempotent by token index: a script run twice with the same
arguments (redis-py retries one whose reply was lost) appends nothing twice. The raw stream, as an
outside consumer reads it, holds each token index once and one final event, and the finish's
bookkeeping (end stream, stage times, the tenant's job set) happens once. Real redis-server; the
retry path itself through a proxy that drops one reply after Redis ran the script."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from broker import keys
from broker.codec import decode_event
from broker.jobs import events as job_events
from broker.jobs.events import EVENT_FIELD, FencedStream
from broker.messages import GenerateResult, JobDone, JobFailed, StreamEvent, TokenDelta, Usage
from broker.redis import client as redis_client
from ops.redis.server import RedisServer

TENANT = "t"


def _result(job_id: str) -> GenerateResult:
    return GenerateResult(job_id, "m", "abc", (1, 2, 3), "stop", Usage(4, 3, 0), "w", 0.0, 0.0, 0.0)


def _raw(client: redis.Redis, job_id: str) -> list[StreamEvent]:
    entries: Any = client.xrange(keys.job_stream(job_id))
    return [decode_event(fields[EVENT_FIELD]) for _, fields in entries]


def _indices(events: list[StreamEvent]) -> list[int]:
    """Every token index the raw events name (a delta without an index follows the previous)."""
    out: list[int] = []
    for e in events:
        if isinstance(e, TokenDelta):
            start = e.start if e.start >= 0 else len(out)
            out.extend(range(start, start + len(e.token_ids)))
    return out


def _lease(client: redis.Redis, job_id: str, epoch: int) -> None:
    client.set(keys.job_epoch(job_id), epoch)
    client.zadd(keys.tenant_jobs(TENANT), {job_id: 1e12})


def test_a_script_run_twice_appends_each_index_and_the_final_once(rds: redis.Redis) -> None:
    _lease(rds, "j", 1)
    stream = FencedStream(rds)
    deltas = [
        TokenDelta("a", (1,), 0, 0, 1),
        TokenDelta("", (2,), 1, 1, 1),  # its character lags (an incomplete one)
        TokenDelta("b", (), 2, 1, 1),  # the character, no new token
    ]
    for d in deltas:
        stream.publish("j", TENANT, d)
        stream.publish("j", TENANT, d)  # the same script again: its reply was lost
    last, done = TokenDelta("c", (3,), 2, 2, 1), JobDone(_result("j"), epoch=1)
    stream.publish_many("j", TENANT, [last, done], {"picked": 1.0})
    written = rds.hget(keys.job_stages("j"), "written")
    stream.publish_many("j", TENANT, [last, done], {"picked": 1.0})
    raw = _raw(rds, "j")
    assert _indices(raw) == [0, 1, 2]  # each index once
    assert [type(e) for e in raw] == [TokenDelta] * 4 + [JobDone]  # the text-only delta too, once
    assert sum(isinstance(e, (JobDone, JobFailed)) for e in raw) == 1
    assert rds.xlen(keys.job_end("j")) == 1
    assert rds.hget(keys.job_stages("j"), "written") == written  # the finish counted once
    assert rds.zscore(keys.tenant_jobs(TENANT), "j") is None
    assert 0 < rds.ttl(keys.job_written("j")) <= job_events.STREAM_TTL_S


def test_a_redelivery_resumes_after_the_held_end_and_a_second_final_is_refused(rds: redis.Redis) -> None:
    _lease(rds, "r", 1)
    stream = FencedStream(rds)
    stream.publish("r", TENANT, TokenDelta("ab", (1, 2), 0, 0, 1))
    rds.incr(keys.job_epoch("r"))  # a new epoch resumes after the tokens the stream holds
    before = job_events.progress(rds, "r")
    assert (len(before.token_ids), before.text_chars) == (2, 2)
    stream.publish("r", TENANT, TokenDelta("c", (3,), 2, 2, 2))
    stream.publish("r", TENANT, TokenDelta("ab", (1, 2), 0, 0, 2))  # already held: refused
    stream.publish("r", TENANT, JobDone(_result("r"), epoch=2))
    job_events.publish(rds, "r", JobFailed("server_error", "late", 500))  # unfenced: a second final
    raw = _raw(rds, "r")
    assert _indices(raw) == [0, 1, 2]
    assert [type(e) for e in raw] == [TokenDelta, TokenDelta, JobDone]
    assert job_events.progress(rds, "r").done is not None


def test_unindexed_deltas_follow_what_is_held(rds: redis.Redis) -> None:
    """Producers without indices (test doubles, tools): each delta appended, the held end moves."""
    job_events.publish(rds, "u", TokenDelta("x", (7,)))
    job_events.publish(rds, "u", TokenDelta("y", (8,)))
    job_events.publish(rds, "u", TokenDelta("y", (8,), 1, 1))  # an indexed copy of the second
    assert _indices(_raw(rds, "u")) == [0, 1]
    assert rds.hmget(keys.job_written("u"), ["t", "c"]) == [b"2", b"2"]


class ReplyDropper:
    """A TCP proxy to Redis that, when armed, closes the connection instead of forwarding the next
    reply: Redis ran the command, the client never hears of it and retries."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.armed = threading.Event()
        self.dropped = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if replies and self.armed.is_set():
                    self.armed.clear()
                    self.dropped += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):  # shutdown wakes the other pump's recv (a close alone would not)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def dropper(redis_server: RedisServer) -> Iterator[ReplyDropper]:
    proxy = ReplyDropper(redis_server.port)
    yield proxy
    proxy.close()


def test_redis_py_retry_of_a_lost_reply_appends_nothing_twice(
    rds: redis.Redis, redis_server: RedisServer, dropper: ReplyDropper
) -> None:
    client = redis_client.connect(f"redis://127.0.0.1:{dropper.port}/0")  # the workers' retrying client
    stream = FencedStream(client)
    _lease(rds, "p", 1)
    stream.publish("p", TENANT, TokenDelta("a", (1,), 0, 0, 1))  # the script is loaded now
    dropper.armed.set()
    stream.publish("p", TENANT, TokenDelta("b", (2,), 1, 1, 1))
    dropper.armed.set()
    stream.publish_many("p", TENANT, [TokenDelta("c", (3,), 2, 2, 1), JobDone(_result("p"), epoch=1)])
    assert dropper.dropped == 2  # both replies were lost and the scripts retried
    raw = _raw(rds, "p")
    assert _indices(raw) == [0, 1, 2]
    assert sum(isinstance(e, JobDone) for e in raw) == 1
    assert rds.xlen(keys.job_end("p")) == 1
    client.close()
