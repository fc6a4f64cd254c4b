"""A batch input file's lines (OpenAI's Batch JSONL): each line parsed and validated with the same
parse as the online endpoints, and the output and error lines in OpenAI's format. Shared by the
online batch runner and the offline `kvferry run-batch` (ops/run_batch.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from api.schema import json_guard
from api.schema.openai import CompletionRequest
from broker.errors import InvalidRequestError, UnknownModelError

# a line's url and body -> the request, as the online endpoint parses it (raises as it does)
Parse = Callable[[str, Any], CompletionRequest]
_LINE_IDS = uuid.UUID("0b6c51a4-5d1e-4d43-9c77-6f1b0c8f2a11")  # namespace of batch_req ids


@dataclass(frozen=True, slots=True)
class BatchLine:
    line_no: int
    custom_id: str | None
    request: CompletionRequest | None = None
    error_code: str | None = None
    error_message: str | None = None
    status_code: int = 400  # what the online endpoint would have answered the bad request with


def parse_line(line_no: int, text: str | bytes, parse: Parse, endpoint: str | None = None) -> BatchLine:
    """endpoint: the batch's; a line whose url names another is refused."""
    try:
        record = json_guard.loads(text)  # bounded depth, no NaN, no lone surrogates
    except InvalidRequestError as exc:
        return BatchLine(
            line_no, None, error_code="invalid_json", error_message=f"line {line_no}: {exc.message}"
        )
    if not isinstance(record, dict):
        return BatchLine(
            line_no, None, error_code="invalid_request", error_message=f"line {line_no}: not an object"
        )
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BatchLine(
            line_no,
            None,
            error_code="invalid_request",
            error_message=f"line {line_no}: 'custom_id' (a non-empty string) is required",
        )
    if record.get("method", "POST") != "POST":
        return BatchLine(
            line_no, custom_id, error_code="invalid_request", error_message="'method' must be POST"
        )
    url = str(record.get("url"))
    if endpoint is not None and url != endpoint:
        message = f"line {line_no}: url {url!r} is not the batch's endpoint {endpoint!r}"
        return BatchLine(line_no, custom_id, error_code="invalid_url", error_message=message)
    try:
        request = parse(url, record.get("body"))
    except UnknownModelError as exc:
        return BatchLine(line_no, custom_id, None, "model_not_found", exc.message, 404)
    except InvalidRequestError as exc:
        code = exc.code or "invalid_request"  # its own when it has one: unsupported_parameter
        return BatchLine(line_no, custom_id, error_code=code, error_message=exc.message)
    return BatchLine(line_no, custom_id, request)


def served_parse(served_model: str) -> Parse:
    """The offline parse: the online body parse, and the one model this process serves."""
    from api.schema.openai import parse_request

    def parse(url: str, body: Any) -> CompletionRequest:
        request = parse_request(url, body)
        if request.model != served_model:
            raise UnknownModelError(f"model {request.model!r} is not served here (serving {served_model!r})")
        return request

    return parse


def numbered(f: IO[bytes], offset: int = 0, line_no: int = 1) -> Iterator[tuple[int, int, bytes]]:
    """(line number, its byte offset, its text) of each non-blank line from `offset`; blank lines
    are skipped but numbered, so a line's number is its line in the file."""
    f.seek(offset)
    for text in f:
        if text.strip():
            yield line_no, offset, text
        offset += len(text)
        line_no += 1


def line_id(batch_id: str, line_no: int) -> str:
    """The output line's id: the same however often the line is answered (finalize keeps one)."""
    return f"batch_req_{uuid.uuid5(_LINE_IDS, f'{batch_id}:{line_no}').hex}"


def ok_line(rid: str, custom_id: str | None, body: dict[str, Any]) -> dict[str, Any]:
    request_id = rid.removeprefix("batch_req_")
    return {
        "id": rid,
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def error_line(rid: str, custom_id: str | None, status_code: int, body: dict[str, Any]) -> dict[str, Any]:
    """A request answered with an error (bad line, failed job): its status and the error body the
    online endpoint would have answered."""
    request_id = rid.removeprefix("batch_req_")
    return {
        "id": rid,
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": request_id, "body": body},
        "error": None,
    }


def unrun_line(rid: str, custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """A request never answered (the batch expired first): no response, an error."""
    return {"id": rid, "custom_id": custom_id, "response": None, "error": {"code": code, "message": message}}
