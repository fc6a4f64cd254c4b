"""Typed errors shared by every stage; the api maps them to HTTP status codes."""

from __future__ import annotations


class KvferryError(Exception):
    """Base of every error kvferry raises on purpose."""


class CodecError(KvferryError, ValueError):
    """A message that does not decode into its declared type (or an object that is no message).
    Between our own processes that is a bug or a version mismatch, never the caller's fault: the
    api answers 500 and logs it (api/errors.py), never 400 or 503."""


class InvalidRequestError(KvferryError, ValueError):
    """The request itself is wrong (HTTP 400). `param` names the offending field; `code` is
    OpenAI's error code when one applies (say "unsupported_parameter")."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class PromptTooLongError(InvalidRequestError):
    """The prompt plus max_tokens exceeds the model's context, or the prompt alone the KV pool.

    A request whose output later outgrows the whole pool ends with finish_reason "length"."""


class UnknownModelError(InvalidRequestError):
    """The model named is not one this process can load or serves (HTTP 404 in the API)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "model")
