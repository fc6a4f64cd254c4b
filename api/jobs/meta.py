"""JobMeta: what the api knew when it queued a job, kept in the hash `keys.job_meta(job_id)` for
ApiConfig.job_ttl_s. It holds no prompt (no messages, no text, no token ids): only what
GET /v1/jobs/{id} needs to describe the job and rebuild its answer from the result."""

from __future__ import annotations

from dataclasses import dataclass, field

from api.schema.openai import CompletionRequest, Endpoint
from api.schema.tool_choice import ToolCalling
from broker import codec
from broker.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class JobMeta:
    job_id: str
    endpoint: str  # "/v1/chat/completions" | "/v1/completions"
    model: str
    queue: str
    reason: str  # why the router chose that queue
    created: float  # unix time of submission
    tenant: str = ""
    session_id: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    echo: bool = False  # completions' echo: the answer starts with the prompt
    tool_parser: str = ""  # a chat whose model may call tools: the parser that reads its calls

    @classmethod
    def of(
        cls, job_id: str, request: CompletionRequest, queue: str, reason: str, created: float, tenant: str
    ) -> JobMeta:
        """What the api records of a request it queues (online or a batch line)."""
        return cls(
            job_id=job_id,
            endpoint=request.endpoint,
            model=request.model,
            queue=queue,
            reason=reason,
            created=created,
            tenant=tenant,
            session_id=request.session_id,
            params=request.params,
            echo=request.echo,
            tool_parser=request.tool_calling.parser if request.tool_calling else "",
        )

    def request(self) -> CompletionRequest:
        """The request as far as building its response body needs (its prompt is not kept)."""
        endpoint: Endpoint = (
            "/v1/chat/completions" if self.endpoint == "/v1/chat/completions" else "/v1/completions"
        )
        calling = ToolCalling("auto", self.tool_parser) if self.tool_parser else None
        return CompletionRequest(
            endpoint,
            self.model,
            self.params,
            session_id=self.session_id,
            echo=self.echo,
            tool_calling=calling,
        )

    def to_hash(self) -> dict[str, str]:
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "queue": self.queue,
            "reason": self.reason,
            "created": repr(self.created),
            "params": codec.encode(self.params).decode(),
            "tenant": self.tenant,
            "session_id": self.session_id or "",
            "echo": "1" if self.echo else "",
            "tool_parser": self.tool_parser,
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
            tenant=h.get("tenant", ""),
            session_id=h.get("session_id") or None,
            params=_params(h.get("params")),
            echo=bool(h.get("echo")),
            tool_parser=h.get("tool_parser", ""),
        )

    @property
    def response_id(self) -> str:
        """The OpenAI object id of this job's answer: chatcmpl-<job id> or cmpl-<job id>."""
        prefix = "chatcmpl" if self.endpoint == "/v1/chat/completions" else "cmpl"
        return f"{prefix}-{self.job_id}"


def _params(raw: str | None) -> SamplingParams:
    if not raw:  # written by an older api
        return SamplingParams()
    return codec.decode(raw, SamplingParams)
