"""JobMeta: what the api knew when it queued a job, kept in the hash `keys.job_meta(job_id)`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.openai_schema import CompletionRequest, parse_request


@dataclass(frozen=True, slots=True)
class JobMeta:
    job_id: str
    endpoint: str  # "/v1/chat/completions" | "/v1/completions"
    model: str
    queue: str
    reason: str  # why the router chose that queue
    created: float  # unix time of submission
    body: dict[str, Any]  # the request body, to rebuild the response body from the result
    tenant: str = ""
    session_id: str | None = None

    def request(self) -> CompletionRequest:
        return parse_request(self.endpoint, self.body)

    def to_hash(self) -> dict[str, str]:
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "queue": self.queue,
            "reason": self.reason,
            "created": repr(self.created),
            "body": json.dumps(self.body, separators=(",", ":")),
            "tenant": self.tenant,
            "session_id": self.session_id or "",
        }

    @classmethod
    def from_hash(cls, job_id: str, raw: dict[bytes, bytes]) -> JobMeta:
        h = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(
            job_id=job_id,
            endpoint=h["endpoint"],
            model=h["model"],
            queue=h["queue"],
            reason=h["reason"],
            created=float(h["created"]),
            body=json.loads(h["body"]),
            tenant=h.get("tenant", ""),
            session_id=h.get("session_id") or None,
        )

    @property
    def response_id(self) -> str:
        """The OpenAI object id of this job's answer: chatcmpl-<job id> or cmpl-<job id>."""
        prefix = "chatcmpl" if self.endpoint == "/v1/chat/completions" else "cmpl"
        return f"{prefix}-{self.job_id}"
