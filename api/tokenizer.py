"""The served model's tokenizer, as /tokenize and /detokenize need it. The api never imports
transformers: whoever builds the app (ops/stack/api_server.py) hands it an implementation, or none, and
those routes then answer 503."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class TokenizerUnavailableError(Exception):
    """The tokenizer cannot be loaded (an unknown model name, files missing): a 503, not the
    request's fault."""


class Tokenizer(Protocol):
    """Blocking calls: the api runs them off the event loop. Each may raise
    TokenizerUnavailableError; a bad input raises broker.errors.InvalidRequestError (a 400)."""

    def max_model_len(self) -> int:
        """The context length the workers hold prompts to."""
        ...

    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool
    ) -> list[int]:
        """The ids a worker would compute for these messages (no special tokens beyond the
        template's own)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Raises InvalidRequestError (param "tokens") for an id outside the vocabulary."""
        ...
