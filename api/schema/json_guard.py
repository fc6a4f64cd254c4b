"""Strict JSON in: nesting at most MAX_DEPTH deep, no NaN/Infinity literals, no lone surrogates
in any string or key. Every violation is an InvalidRequestError (a 400), never a RecursionError
or a UnicodeEncodeError later on (a 500, or a job that fails on its worker)."""

from __future__ import annotations

import json
from typing import Any

from broker.errors import InvalidRequestError

MAX_DEPTH = 64  # an OpenAI body nests about 5 deep; 64 leaves room for any honest client


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(data: bytes | str, param: str = "body") -> Any:
    """Parse a request document; raises InvalidRequestError naming `param`."""
    try:
        doc = json.loads(data, parse_constant=_no_constant)
    except RecursionError:  # CPython's decoder stops near 1,000 levels
        raise InvalidRequestError(f"the JSON is nested deeper than {MAX_DEPTH} levels", param) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}", param) from None
    check(doc, param)
    return doc


def _valid_text(s: str) -> bool:
    try:
        s.encode("utf-8")  # fails exactly on lone surrogates ("\ud800" escapes)
    except UnicodeEncodeError:
        return False
    return True


def check(doc: Any, param: str = "body") -> None:
    """Walk a parsed document without recursion: depth and Unicode."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not _valid_text(value):
                raise InvalidRequestError("a string holds invalid Unicode (a lone surrogate)", param)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise InvalidRequestError(f"the JSON is nested deeper than {MAX_DEPTH} levels", param)
        if isinstance(value, dict):
            for key, item in value.items():
                if not _valid_text(key):
                    raise InvalidRequestError("a key holds invalid Unicode (a lone surrogate)", param)
                stack.append((item, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in value)
