"""GrammarCompiler: specs compiled against one tokenizer, each once, kept in a bounded LRU. Any
thread may call it: a job's task thread compiles before it submits, so the engine's thread never
waits on a compile."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

import llguidance
import llguidance.hf

from broker.errors import InvalidRequestError
from broker.structured import Kind, StructuredOutputs
from workers.engine.grammar.matcher import CompiledGrammar

CACHE_SIZE = 128  # distinct specs kept; a request's matcher is its own copy, never evicted


class GrammarCompiler:
    def __init__(self, tokenizer: Any, eos_token_ids: Collection[int], capacity: int = CACHE_SIZE) -> None:
        self._hf = tokenizer
        self._eos = sorted(eos_token_ids)
        self.capacity = capacity
        self._ll: llguidance.LLTokenizer | None = None  # built on the first compile (it costs ~1s)
        self._cache: OrderedDict[tuple[Kind, str], CompiledGrammar] = OrderedDict()
        # One compile at a time: a spec asked for by two jobs at once is compiled once.
        self._lock = threading.Lock()
        self.compiles = 0
        self.hits = 0

    def compile(self, spec: StructuredOutputs | None) -> CompiledGrammar | None:
        """spec's grammar (None for none). Raises InvalidRequestError, `param` spec.source, when
        it does not compile: a 400 before the engine sees the request."""
        if spec is None:
            return None
        key = spec.key
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return compiled
            compiled = self._compile(spec)
            self.compiles += 1
            self._cache[key] = compiled
            if len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
            return compiled

    def __len__(self) -> int:
        return len(self._cache)

    def _tokenizer(self, source: str) -> llguidance.LLTokenizer:
        if self._ll is None:
            try:
                self._ll = llguidance.hf.from_tokenizer(self._hf, eos_token=self._eos or None)
            except Exception as exc:  # e.g. a slow (Python) tokenizer, which llguidance cannot read
                raise InvalidRequestError(
                    f"structured outputs are not available for this model's tokenizer: {exc}", source
                ) from exc
        return self._ll

    def _compile(self, spec: StructuredOutputs) -> CompiledGrammar:
        tokenizer = self._tokenizer(spec.source)
        matcher = llguidance.LLMatcher(tokenizer, spec.grammar_text(), log_level=0)
        if matcher.is_error():
            raise spec.invalid(matcher.get_error())
        return CompiledGrammar(matcher, tokenizer.vocab_size)
