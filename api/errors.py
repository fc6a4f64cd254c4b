"""Every error leaves the api as an OpenAI error body: {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.jobs.errors import BrokerUnavailableError
from api.jobs.view import failed_body
from api.schema.answer.bodies import error_body
from broker.errors import CodecError, InvalidRequestError, UnknownModelError
from broker.messages import JobFailed

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An HTTP error raised on purpose, with its OpenAI error fields."""

    def __init__(
        self,
        status_code: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_response(
    status_code: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param, code), status_code=status_code)


def failed_response(failed: JobFailed) -> JSONResponse:
    return JSONResponse(failed_body(failed), status_code=failed.status_code)


def _http_kind(status_code: int) -> str:
    return {401: "authentication_error", 404: "not_found_error"}.get(status_code, "invalid_request_error")


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    response = error_response(exc.status_code, exc.message, exc.kind, exc.param, exc.code)
    response.headers.update(exc.headers)
    return response


async def _invalid_request(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequestError)
    if isinstance(exc, UnknownModelError):
        return error_response(404, exc.message, "invalid_request_error", "model", "model_not_found")
    return error_response(400, exc.message, "invalid_request_error", exc.param, exc.code)


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    return error_response(400, f"{where or 'request'}: {first.get('msg', 'invalid')}", param=where)


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    response = error_response(exc.status_code, str(exc.detail), _http_kind(exc.status_code))
    response.headers.update(exc.headers or {})
    return response


# What a client reads when the queue service fails: never the exception's text (it names internal
# hosts, ports and Sentinel masters); that goes to the log only.
UNAVAILABLE = "the queue service is unavailable; try again later"
INTERNAL = "internal error"


async def _unavailable(_: Request, exc: Exception) -> JSONResponse:
    log.warning("queue service unavailable: %s: %s", type(exc).__name__, exc)
    return error_response(503, UNAVAILABLE, "service_unavailable_error")


async def _codec(_: Request, exc: Exception) -> JSONResponse:
    # A message between our own processes that does not decode: a bug or a version mismatch.
    # Neither the client's fault (400) nor the queue service's (503).
    log.error("a broker message does not decode", exc_info=exc)
    return error_response(500, INTERNAL, "server_error")


async def _internal(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}", "server_error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(InvalidRequestError, _invalid_request)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(BrokerUnavailableError, _unavailable)
    app.add_exception_handler(redis.RedisError, _unavailable)
    app.add_exception_handler(OperationalError, _unavailable)  # kombu's: the broker is unreachable
    app.add_exception_handler(CodecError, _codec)
    app.add_exception_handler(Exception, _internal)
