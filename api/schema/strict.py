"""The base of every request model: strict types ("false" is no boolean, 1.0 no integer),
no unknown field (a 400 `unsupported_parameter`, api/schema/validation.py), frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

UNSUPPORTED = "unsupported_parameter"  # the error type (and OpenAI code) of a field kvferry lacks


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def unsupported(message: str) -> PydanticCustomError:
    """A validation error that answers 400 `unsupported_parameter` (a value kvferry would have to
    act on, but cannot); the message follows the field's name."""
    return PydanticCustomError(UNSUPPORTED, message)
