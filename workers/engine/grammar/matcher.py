"""CompiledGrammar (a spec compiled against the engine's tokenizer, shared by every request that
asks for it) and GrammarMatcher (one request's place in it)."""

from __future__ import annotations

from collections.abc import Sequence

import llguidance

from workers.engine.errors import RequestFailedError

PARAM = "structured_outputs"


class CompiledGrammar:
    """A matcher that never consumes a token: each request starts from a copy of it (a copy
    costs far less than building one, and shares the grammar's lexer)."""

    def __init__(self, prototype: llguidance.LLMatcher, vocab_size: int) -> None:
        self._prototype = prototype
        self.vocab_size = vocab_size  # the tokenizer's: one mask bit per token id below it

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._prototype.deep_copy(), self.vocab_size)


class GrammarMatcher:
    """Which tokens may come next, and whether the output is complete. Used by the engine's
    thread alone."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.ll = matcher
        self.vocab_size = vocab_size

    @property
    def mask_words(self) -> int:
        """int32 words of one token mask."""
        return (self.vocab_size + 31) // 32

    def check(self) -> None:
        """Raise RequestFailedError if the matcher broke (a resource limit, a refused token): its
        masks would then allow EOS alone, ending the output silently."""
        if self.ll.is_error():
            raise RequestFailedError(f"the grammar matcher failed: {self.ll.get_error()[:300]}", PARAM)

    def accept(self, token: int) -> bool:
        """Advance by a sampled token; True once the output is complete (no token may follow,
        or it took an EOS). Raises RequestFailedError if the grammar refuses it."""
        if not self.ll.consume_token(token):
            self.check()
            raise RequestFailedError(f"the grammar refused token {token}", PARAM)
        return self.ll.is_stopped()

    def replay(self, tokens: Sequence[int]) -> bool:
        """Advance by output made before (a resumed request); True if it is already complete."""
        if tokens and not self.ll.consume_tokens(list(tokens)):
            self.check()
            raise RequestFailedError("the grammar refused the output being resumed", PARAM)
        return self.ll.is_stopped()
