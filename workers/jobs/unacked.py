"""kombu's unacked messages as the sweeps see them: by delivery tag, through the small records of
broker/jobs/delivery.py, never by parsing every payload on every pass.

A tag whose record is missing (a message another producer queued with send_task, or one queued
before the records existed) is classified once: its payload is read and parsed, and the result
(the job id, or "" for anything else) recorded for the job's TTL. A malformed entry is classified
as no job of ours, logged and counted, and skipped from then on: it never stops the others.
A payload is parsed again only to move its message back onto a queue (restore), which is rare.
"""

from __future__ import annotations

import collections
import json
import logging
from typing import Any

import redis

from broker import keys, priority
from broker.defaults import DEFAULTS
from broker.jobs.delivery import NOT_A_JOB

log = logging.getLogger(__name__)
RECORD_TTL_S = DEFAULTS.job_ttl_s


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_entry(raw: bytes | str) -> tuple[str | None, dict[str, Any], str]:
    """(task id of a kvferry.generate message or None, its payload, its routing key) of an unacked
    entry ([payload, exchange, routing key], kombu's format); ValueError when it is not one."""
    try:
        payload, _exchange, routing_key = json.loads(raw)
        headers = payload["headers"]
        task_id = headers.get("id") if headers.get("task") == keys.GENERATE_TASK else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a kombu unacked entry: {exc!r}") from exc
    if not isinstance(payload, dict) or not isinstance(routing_key, str):
        raise ValueError("not a kombu unacked entry")
    return (task_id if isinstance(task_id, str) else None), payload, routing_key


def job_ids(
    client: redis.Redis, tags: list[str], counts: collections.Counter[str] | None = None
) -> dict[str, str]:
    """tag -> job id ("" for no job of ours) for each tag still unacked; one MGET, plus one read
    of the payload of each tag never classified before."""
    if not tags:
        return {}
    recorded: Any = client.mget([keys.message_job(t) for t in tags])
    out = {t: _text(r) for t, r in zip(tags, recorded, strict=True) if r is not None}
    unknown = [t for t in tags if t not in out]
    if unknown:
        out.update(_classify(client, unknown, counts))
    return out


def _classify(
    client: redis.Redis, tags: list[str], counts: collections.Counter[str] | None
) -> dict[str, str]:
    raws: Any = client.hmget(keys.KOMBU_UNACKED, tags)
    found: dict[str, str] = {}
    for tag, raw in zip(tags, raws, strict=True):
        if raw is None:
            continue  # acked meanwhile
        try:
            task_id, _, _ = parse_entry(raw)
        except ValueError as exc:
            log.warning("unacked message %s is malformed; skipped from now on: %s", tag, exc)
            if counts is not None:
                counts["malformed_entries"] += 1
            task_id = None
        found[tag] = task_id or NOT_A_JOB
    if found:
        pipe = client.pipeline(transaction=False)
        for tag, job_id in found.items():
            pipe.set(keys.message_job(tag), job_id, ex=RECORD_TTL_S)
        pipe.execute()
    return found


def restore(client: redis.Redis, tag: str, dead_queue: str) -> str | None:
    """Move one unacked message back onto a queue, atomically (WATCH: kombu's own sweep may race);
    onto the shared queue when it was routed to `dead_queue`; into its priority band's list, as
    kombu's own restore does. Returns its task id, None when it
    was gone. ValueError for a malformed entry."""
    with client.pipeline() as pipe:
        try:
            pipe.watch(keys.KOMBU_UNACKED)
            raw: Any = pipe.hget(keys.KOMBU_UNACKED, tag)
            if raw is None:
                pipe.unwatch()
                return None
            task_id, payload, routing_key = parse_entry(raw)
            queue = keys.SHARED_QUEUE if routing_key == dead_queue else routing_key
            payload["headers"]["redelivered"] = True
            payload.setdefault("properties", {}).setdefault("delivery_info", {})["redelivered"] = True
            pipe.multi()
            pipe.hdel(keys.KOMBU_UNACKED, tag)
            pipe.zrem(keys.KOMBU_UNACKED_INDEX, tag)
            key = priority.queue_key(queue, priority.message_band(payload))  # its own band
            pipe.rpush(key, json.dumps(payload))  # the consuming end: redelivered first
            pipe.execute()
            return task_id
        except redis.WatchError:
            return None


def drop(client: redis.Redis, tag: str) -> None:
    """Forget an unacked message: the ack its worker could not send."""
    pipe = client.pipeline(transaction=True)
    pipe.hdel(keys.KOMBU_UNACKED, tag)
    pipe.zrem(keys.KOMBU_UNACKED_INDEX, tag)
    pipe.execute()


def tags_of_jobs(
    client: redis.Redis, wanted: set[str], counts: collections.Counter[str] | None = None
) -> dict[str, str]:
    """tag -> job id of every unacked message of the jobs in `wanted` (a dead worker's): the tags
    (HKEYS, no payloads), then their records."""
    if not wanted:
        return {}
    tags = [_text(t) for t in client.hkeys(keys.KOMBU_UNACKED)]
    return {t: j for t, j in job_ids(client, tags, counts).items() if j in wanted}
