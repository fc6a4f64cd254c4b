"""The one codec: typed messages <-> JSON-safe dicts (and bytes). Never pickle.

Stream events carry their type under the "event" key and are decoded by type; unknown types and
unknown fields raise CodecError instead of being guessed at.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar, get_type_hints

from broker.errors import KvferryError
from broker.messages import GenerateJob, GenerateResult, JobDone, JobFailed, StreamEvent, TokenDelta

T = TypeVar("T")
_EVENTS: dict[str, type[Any]] = {"delta": TokenDelta, "done": JobDone, "failed": JobFailed}
_EVENT_NAMES = {cls: name for name, cls in _EVENTS.items()}


class CodecError(KvferryError, ValueError):
    """A message that does not decode into its declared type."""


def to_wire(obj: Any) -> Any:
    """Dataclasses become dicts, tuples lists; everything else must already be JSON-safe."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_wire(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_wire(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_wire(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise CodecError(f"cannot encode {type(obj).__name__}")


def _from(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _from(arg, value, where)
            except CodecError:
                continue
        raise CodecError(f"{where}: {value!r} matches none of {hint}")
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise CodecError(f"{where}: {value!r} is not one of {typing.get_args(hint)}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise CodecError(f"{where}: expected a list")
        inner = typing.get_args(hint)[0]
        return tuple(_from(inner, v, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        return from_wire(hint, value, where)  # type: ignore[arg-type]
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CodecError(f"{where}: expected a number")
        return float(value)
    if hint in (int, str, bool):
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise CodecError(f"{where}: expected {hint.__name__}")
        return value
    raise CodecError(f"{where}: unsupported type {hint}")


def from_wire(cls: type[T], data: Any, where: str = "") -> T:
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise CodecError(f"{where}: expected an object")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise CodecError(f"{where}: unknown fields {sorted(unknown)}")
    kwargs = {k: _from(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise CodecError(f"{where}: {exc}") from exc


def encode_job(job: GenerateJob) -> dict[str, Any]:
    return typing.cast(dict[str, Any], to_wire(job))


def decode_job(data: Any) -> GenerateJob:
    return from_wire(GenerateJob, data)


def encode_result(result: GenerateResult) -> dict[str, Any]:
    return typing.cast(dict[str, Any], to_wire(result))


def decode_result(data: Any) -> GenerateResult:
    return from_wire(GenerateResult, data)


def encode_event(event: StreamEvent) -> bytes:
    name = _EVENT_NAMES.get(type(event))
    if name is None:
        raise CodecError(f"not a stream event: {type(event).__name__}")
    return json.dumps({"event": name, "data": to_wire(event)}, separators=(",", ":")).encode()


def decode_event(raw: bytes | str) -> StreamEvent:
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CodecError(f"stream event is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("event") not in _EVENTS:
        raise CodecError(f"unknown stream event {doc.get('event') if isinstance(doc, dict) else doc!r}")
    return typing.cast(StreamEvent, from_wire(_EVENTS[doc["event"]], doc.get("data")))
