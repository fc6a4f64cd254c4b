"""Validating a request body against its pydantic model: the first bad field as an
InvalidRequestError whose param names it (top-level), or, for a field kvferry does not implement,
the whole path to it (code unsupported_parameter)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from api.schema.strict import UNSUPPORTED
from broker.errors import InvalidRequestError
from broker.penalty_params import MAX_LOGIT_BIAS
from broker.sampling import MAX_STOP_STRINGS

M = TypeVar("M", bound=BaseModel)

MAX_PARAM_CHARS = 64  # an unknown key is the client's own text: echo a bounded piece of it


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_PARAM_CHARS else text[:MAX_PARAM_CHARS] + "…"


_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict"})  # pydantic's union member tags


def _where(loc: tuple[int | str, ...]) -> str:
    """("messages", 0, "content", "str") -> "messages[0].content"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("_", "").isalpha() and part.islower() and part not in _TAGS:
            out += ("." if out else "") + _bounded(part)  # a dict's key is the client's text
    return out or "body"


# Fields whose pydantic message (one per union member) would mislead: say what is expected.
_EXPECTED = {
    "prompt": "must be a non-empty string or a non-empty list of token ids in [0, 2**31)",
    "stop": f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS} non-empty strings",
    "content": "must be a string or a list of text parts ({type: text, text: ...})",
    "logit_bias": f"must map at most {MAX_LOGIT_BIAS} token ids (decimal strings) to numbers in [-100, 100]",
}


def unsupported_parameter(param: str, message: str | None = None) -> InvalidRequestError:
    """The 400 for a field kvferry does not implement (or a value of one it cannot honour)."""
    param = _bounded(param)
    message = message or f"Unsupported parameter: {param!r} is not supported by kvferry"
    return InvalidRequestError(message, param, UNSUPPORTED)


def _unsupported(error: ErrorDetails) -> InvalidRequestError:
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden":  # the last part is the key as sent: no tag to drop
        head = _where(loc[:-1])
        key = str(loc[-1])
        return unsupported_parameter(key if head == "body" else f"{head}.{key}")
    where = _where(loc)
    return unsupported_parameter(where, f"{where}: {error['msg']}")


def _invalid(exc: ValidationError) -> InvalidRequestError:
    errors = exc.errors(include_url=False)
    # An unsupported field first: inside a union its member's type error (a list is no str)
    # comes first but says less. A union of models should be discriminated
    # (Field(discriminator=...)), so that only the chosen member's errors are reported.
    lacking = [e for e in errors if e["type"] in ("extra_forbidden", UNSUPPORTED)]
    if lacking:
        return _unsupported(lacking[0])
    first = errors[0]
    loc = tuple(first["loc"])
    param = str(loc[0]) if loc else "body"
    where = _where(loc)
    field = where.rsplit(".", 1)[-1].split("[")[0]
    if field in _EXPECTED and first["type"] not in ("literal_error", "missing"):
        return InvalidRequestError(f"{where}: {_EXPECTED[field]}", param)
    return InvalidRequestError(f"{where}: {first['msg']}", param)


def validate(model: type[M], body: Any) -> M:
    """The body as `model`, or an InvalidRequestError whose param names the first bad field."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", "body")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc) from None
