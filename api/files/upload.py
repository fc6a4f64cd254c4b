"""Reading a POST /v1/files body while it streams in, never whole in memory.

python_multipart's streaming parser is fed from request.stream(); the `file` part's bytes go to a
FileWriter as they pass, counted on the way, so the limits hold during the upload: more bytes than
the limit -> 413, more lines than the limit for purpose "batch" (or bytes that are not UTF-8) ->
400. On any refusal the route drops the partial file and answers at once: the rest of the body is
never read. A declared Content-Length past the limit is refused before a byte is read; a body that
declares none (chunked) is counted as it streams, under the same limit (413).

The other form fields are held in memory, so they are bounded in number, each, and in all (a part's
headers too); a field the API does not know, or one given twice, is a 400 naming it.

The lines of a batch file are not parsed here: the batch runner validates each one and reports a
bad one in the batch's error file (a line is never lost to an upload-time refusal)."""

from __future__ import annotations

import asyncio
import codecs
from dataclasses import dataclass, field

from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from api.errors import ApiError
from api.files.records import PURPOSES
from api.files.store import FileWriter

__all__ = ["FORM_SLACK", "Upload", "check_declared_size", "receive"]

# Room in a body for the form's framing and its small fields, beyond the file's own bytes: it
# holds every field's part headers and bytes (each bounded below), with room to spare.
FORM_SLACK = 64 * 1024
# The fields besides `file`, as the openai client sends them: each at most once, so few.
_FIELDS = ("purpose", "expires_after[anchor]", "expires_after[seconds]")
_FIELD_MAX = 4096  # one form field
_FIELDS_TOTAL = 8 * 1024  # every field's bytes together
_HEADERS_MAX = 4 * 1024  # one part's headers


@dataclass(frozen=True, slots=True)
class Upload:
    filename: str
    purpose: str
    bytes: int
    lines: int  # non-blank lines
    fields: dict[str, str]  # the form's other fields, by name (_FIELDS)


def check_declared_size(request: Request, max_bytes: int) -> None:
    """413 when the body's declared length cannot hold a file within the limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes + FORM_SLACK:
        raise _too_large(max_bytes)


async def receive(request: Request, writer: FileWriter, max_bytes: int, max_lines: int) -> Upload:
    """Stream the form's `file` part into `writer` (not committed here) and return what it held."""
    kind, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise ApiError(400, "the body must be multipart/form-data with a `file` and a `purpose`")
    form = _Form(max_bytes, max_lines)
    parser = MultipartParser(boundary, form.callbacks())  # type: ignore[arg-type]
    body = 0
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            form.check()
            body += len(chunk)
            if body > max_bytes + FORM_SLACK:  # a chunked body has no Content-Length to refuse early
                raise _body_too_large(max_bytes)
            if form.pending:
                data = b"".join(form.pending)
                form.pending.clear()
                await asyncio.to_thread(writer.write, data)
        parser.finalize()
    except MultipartParseError as exc:
        raise ApiError(400, f"the multipart body does not parse: {exc}") from None
    return form.result()


def _body_too_large(max_bytes: int) -> ApiError:
    message = (
        f"the request body is larger than the limit of {max_bytes + FORM_SLACK} bytes "
        f"(the file's limit of {max_bytes} bytes and {FORM_SLACK} for the form)"
    )
    return ApiError(413, message, code="request_too_large")


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413, f"the file is larger than the limit of {max_bytes} bytes", param="file", code="file_too_large"
    )


@dataclass
class _Form:
    """The parser's callbacks write here; check() turns what they saw into a refusal."""

    max_bytes: int
    max_lines: int
    pending: list[bytes] = field(default_factory=list)  # file bytes not yet handed to the writer
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    size: int = 0
    lines: int = 0
    error: ApiError | None = None
    _line_open: bool = False  # the current (unfinished) line holds a non-blank byte
    _utf8: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")())
    _utf8_ok: bool = True
    _header: bytearray = field(default_factory=bytearray)
    _value: bytearray = field(default_factory=bytearray)
    _headers: dict[str, bytes] = field(default_factory=dict)
    _part: str | None = None  # the current part's name; "file" for the file part
    _header_bytes: int = 0  # the current part's headers so far
    _field: bytearray = field(default_factory=bytearray)
    _fields_bytes: int = 0  # every field's bytes so far, and every part's headers'

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._header_data(self._header, d[s:e]),
            "on_header_value": lambda d, s, e: self._header_data(self._value, d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.fields.get("purpose") == "batch":
            self._check_batch()

    def result(self) -> Upload:
        self.check()
        if self.filename is None:
            raise ApiError(400, "the form has no `file` part (a file upload)", param="file")
        purpose = self.fields.get("purpose")
        if purpose is None:
            raise ApiError(400, "the form has no `purpose` field", param="purpose")
        lines = self.lines + (1 if self._line_open else 0)
        return Upload(self.filename, purpose, self.size, lines if purpose == "batch" else 0, self.fields)

    def _check_batch(self) -> None:
        if self.lines + (1 if self._line_open else 0) > self.max_lines:
            message = f"a batch file may hold at most {self.max_lines} lines"
            raise ApiError(400, message, param="file", code="too_many_lines")
        if not self._utf8_ok:
            raise ApiError(400, "a batch file must be UTF-8 JSONL", param="file", code="invalid_file_format")

    def _part_begin(self) -> None:
        self._headers.clear()
        self._part = None
        self._header_bytes = 0

    def _header_data(self, into: bytearray, data: bytes) -> None:
        self._header_bytes += len(data)
        if self._header_bytes > _HEADERS_MAX and self.error is None:
            self.error = ApiError(400, f"a form part's headers exceed the limit of {_HEADERS_MAX} bytes")
        if self.error is None:
            into.extend(data)

    def _header_end(self) -> None:
        self._headers[self._header.decode("latin-1").strip().lower()] = bytes(self._value)
        self._header.clear()
        self._value.clear()

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get("content-disposition", b""))
        self._part = params.get(b"name", b"").decode("utf-8", "replace")
        self._field.clear()
        if self.error is not None:
            return
        if self._part == "file":
            if self.filename is not None:
                self.error = ApiError(400, "the form holds more than one `file`", param="file")
            self.filename = params.get(b"filename", b"upload").decode("utf-8", "replace")
        elif self._part not in _FIELDS:
            known = ", ".join(("file", *_FIELDS))
            message = f"the form field {self._part!r} is not one of {known}"
            self.error = ApiError(400, message, param=self._part, code="unknown_parameter")
        elif self._part in self.fields:
            self.error = ApiError(400, f"the form field {self._part!r} is given twice", param=self._part)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self.error is not None:
            return
        if self._part != "file":
            self._field.extend(data[start:end])
            self._fields_bytes += end - start
            if len(self._field) > _FIELD_MAX:
                self.error = ApiError(400, f"the form field {self._part!r} is too long", param=self._part)
            elif self._fields_bytes > _FIELDS_TOTAL:
                message = f"the form's fields exceed the limit of {_FIELDS_TOTAL} bytes in all"
                self.error = ApiError(413, message, param=self._part, code="fields_too_large")
            return
        chunk = data[start:end]
        self.size += len(chunk)
        if self.size > self.max_bytes:
            self.error = _too_large(self.max_bytes)
            return
        self.pending.append(chunk)
        self._count(chunk)

    def _part_end(self) -> None:
        if self._part == "file":
            if self._utf8_ok:
                self._decode(b"", final=True)
        elif self._part and self.error is None:
            value = self._field.decode("utf-8", "replace")
            self.fields[self._part] = value
            if self._part == "purpose" and value not in PURPOSES:
                allowed = ", ".join(repr(p) for p in PURPOSES)
                self.error = ApiError(400, f"purpose: {value!r} is not one of {allowed}", param="purpose")

    def _count(self, chunk: bytes) -> None:
        pieces = chunk.split(b"\n")
        for i, piece in enumerate(pieces):
            if piece.strip():
                self._line_open = True
            if i < len(pieces) - 1:  # a newline ends this line
                self.lines += self._line_open
                self._line_open = False
        if self._utf8_ok:
            self._decode(chunk)

    def _decode(self, chunk: bytes, final: bool = False) -> None:
        try:
            self._utf8.decode(chunk, final)
        except UnicodeDecodeError:
            self._utf8_ok = False
