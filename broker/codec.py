"""The one codec: typed messages (broker/messages.py) <-> JSON, or the JSON-safe builtins Celery
carries as task arguments and results. Never pickle.

msgspec checks every type on the way in: unknown fields, wrong types, missing required fields
and unknown stream-event types raise CodecError, never a guess. A value that decodes but breaks a
message's own rule (SamplingParams' range checks) raises that rule's InvalidRequestError, `param`
and all, exactly as constructing it would.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from broker.errors import CodecError, InvalidRequestError
from broker.messages import GenerateJob, GenerateResult, StreamEvent, StreamEventBase

__all__ = [
    "CodecError",
    "decode",
    "decode_event",
    "decode_job",
    "decode_result",
    "encode",
    "encode_event",
    "encode_job",
    "encode_result",
    "from_wire",
    "to_wire",
]

T = TypeVar("T")
_ENCODER = msgspec.json.Encoder()
_EVENTS = msgspec.json.Decoder(StreamEvent)


def _typed(exc: msgspec.MsgspecError, what: str) -> Exception:
    # msgspec wraps what a __post_init__ raised; the caller wants the message's own error back.
    if isinstance(exc.__cause__, InvalidRequestError):
        return exc.__cause__
    return CodecError(f"{what}: {exc}")


def to_wire(obj: Any) -> Any:
    """A message as JSON-safe builtins (dicts, lists, tuples, str, numbers, None)."""
    try:
        return msgspec.to_builtins(obj)
    except TypeError as exc:
        raise CodecError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def from_wire(cls: type[T], data: Any) -> T:
    """Builtins (as json.loads or Celery gives them) -> a `cls`, every field checked."""
    try:
        return msgspec.convert(data, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise _typed(exc, cls.__name__) from exc


def encode(obj: Any) -> bytes:
    """A message as compact JSON."""
    try:
        return _ENCODER.encode(obj)
    except TypeError as exc:
        raise CodecError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def decode(raw: bytes | str, cls: type[T]) -> T:
    """JSON -> a `cls`; bytes that are not JSON raise CodecError too."""
    try:
        return msgspec.json.decode(raw, type=cls)
    except msgspec.MsgspecError as exc:  # DecodeError (not JSON) or ValidationError (wrong shape)
        raise _typed(exc, cls.__name__) from exc


def encode_job(job: GenerateJob) -> dict[str, Any]:
    return to_wire(job)


def decode_job(data: Any) -> GenerateJob:
    return from_wire(GenerateJob, data)


def encode_result(result: GenerateResult) -> dict[str, Any]:
    return to_wire(result)


def decode_result(data: Any) -> GenerateResult:
    return from_wire(GenerateResult, data)


def encode_event(event: StreamEvent) -> bytes:
    """{"event": "delta" | "done" | "failed", ...its fields} as JSON."""
    if not isinstance(event, StreamEventBase):  # any other message would encode, untagged
        raise CodecError(f"not a stream event: {type(event).__name__}")
    return encode(event)


def decode_event(raw: bytes | str) -> StreamEvent:
    try:
        return _EVENTS.decode(raw)
    except msgspec.MsgspecError as exc:
        raise _typed(exc, "stream event") from exc
