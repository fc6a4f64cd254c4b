"""PrefetchHint: "this session's next turn is coming to you": the router pushes one onto the
chosen worker's prefetch list (keys.worker_prefetch) when the session's blocks are not in that
worker's pool, so the worker loads them from the Redis tier into its warm tier while the job
waits in the queue. A hint is only advice: lost, late or wrong, it costs a fetch, never a token."""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_PENDING = 64  # hints a worker's list keeps (older ones are dropped: their turns ran already)
HINT_TTL_S = 60  # a list nobody drains (its worker died) goes away


@dataclass(frozen=True, slots=True)
class PrefetchHint:
    tenant: str
    session_id: str
    kv_salt: str  # the root of the session's block hashes (tenant and cache salt)


def encode(hint: PrefetchHint) -> bytes:
    return json.dumps([hint.tenant, hint.session_id, hint.kv_salt]).encode()


def decode(raw: bytes | str) -> PrefetchHint | None:
    try:
        tenant, session_id, kv_salt = json.loads(raw)
    except (ValueError, TypeError):
        return None
    if not all(isinstance(v, str) for v in (tenant, session_id, kv_salt)):
        return None
    return PrefetchHint(tenant, session_id, kv_salt)
