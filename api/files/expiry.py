"""OpenAI's `expires_after` (a file's) and `output_expires_after` (a batch's output and error
files'): `{"anchor": "created_at", "seconds": N}` with N from one hour to 30 days. A file without
one is kept until deleted, but a purpose "batch" upload and a batch's output files, which expire
after the api's defaults (KVFERRY_FILES_BATCH_EXPIRY_S, KVFERRY_BATCH_OUTPUT_EXPIRY_S)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.errors import ApiError

__all__ = ["MAX_S", "MIN_S", "ExpiresAfter", "expires_at", "from_form"]

MIN_S = 3600
MAX_S = 30 * 86400


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_S, le=MAX_S)


def from_form(fields: dict[str, str]) -> ExpiresAfter | None:
    """The upload form's `expires_after[anchor]` and `expires_after[seconds]` (as the openai client
    sends them); None when neither is given, a 400 naming `expires_after` when they are wrong."""
    named = {k: f"expires_after[{k}]" for k in ("anchor", "seconds")}
    given = {k: fields[name] for k, name in named.items() if name in fields}
    if not given:
        return None
    try:
        return ExpiresAfter.model_validate(given)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        message = (
            f"expires_after.{where}: {problem['msg']} (expires_after needs anchor 'created_at' "
            f"and seconds from {MIN_S} to {MAX_S})"
        )
        raise ApiError(400, message, param="expires_after") from None


def expires_at(created_at: int, chosen: ExpiresAfter | None, default_s: int) -> int:
    """The unix time a file made at `created_at` expires; 0: never (no choice and no default)."""
    seconds = chosen.seconds if chosen is not None else default_s
    return created_at + seconds if seconds > 0 else 0
