"""Engine errors: one request's failure (the client's fault, 400) versus the engine's (retryable)."""

from __future__ import annotations

from broker.errors import InvalidRequestError, KvferryError


class EngineFailedError(KvferryError, RuntimeError):
    """The engine (not one request) failed: a step raised, or the loop thread is dead or stopped.

    Retryable: the job did nothing wrong, so the service hands it back for redelivery instead of
    failing it. A RuntimeError too, so callers that predate this type keep catching it."""

    retryable = True


class RequestFailedError(InvalidRequestError):
    """Sampling or detokenising one request raised mid-step: that request alone is failed (400).

    `param` names the stage ("sampling" or "detokenize") unless the cause was itself an
    InvalidRequestError naming a field; the original exception is chained as __cause__."""

    retryable = False

    @classmethod
    def wrap(cls, exc: BaseException, stage: str) -> InvalidRequestError:
        if isinstance(exc, InvalidRequestError):
            return exc
        err = cls(f"{stage} failed for this request: {type(exc).__name__}: {exc}", stage)
        err.__cause__ = exc
        return err
