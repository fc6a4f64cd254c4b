"""Where one timed turn's TTFT goes, for `kvferry bench responses`: the client's send time, the
worker's stage stamps (keys.job_stages: picked, leased, submitted, first_token) and the route
reason the api recorded (keys.job_meta), found through the response's stored record. Stages:
api + queue (sent → picked), worker setup with the job's own Redis load (picked → submitted: the
session's tokens, the prompt's missing blocks fetched on the job's thread), engine (submitted →
first token: warm → pool copies and the prefill) and the first token's way out (the rest)."""

from __future__ import annotations

from typing import Any

import msgspec
import redis

from broker import keys


def _stamps(client: redis.Redis, job_id: str) -> dict[str, float]:
    raw: Any = client.hgetall(keys.job_stages(job_id))
    return {k.decode(): float(v) for k, v in raw.items()}


def turn_split(client: redis.Redis, response_id: str, sent_at: float, ttft_s: float) -> dict[str, Any]:
    """{api_queue_ms, setup_ms, engine_ms, out_ms, route}; {} when the record or stamps are gone."""
    raw: Any = client.get(keys.response_record("", response_id))
    if raw is None:
        return {}
    job_id = str(msgspec.json.decode(raw).get("job_id", ""))
    s = _stamps(client, job_id)
    if not {"picked", "submitted", "first_token"} <= s.keys():
        return {}
    reason: Any = client.hget(keys.job_meta(job_id), "reason")
    first_seen = sent_at + ttft_s
    return {
        "api_queue_ms": round((s["picked"] - sent_at) * 1000, 1),
        "setup_ms": round((s["submitted"] - s["picked"]) * 1000, 1),
        "engine_ms": round((s["first_token"] - s["submitted"]) * 1000, 1),
        "out_ms": round((first_seen - s["first_token"]) * 1000, 1),
        "route": reason.decode() if isinstance(reason, bytes) else "",
    }
