"""The api's tokenizer (api/tokenizer.py's protocol) backed by the served model's HF tokenizer.

`kvferry api` must start without torch or transformers (tests/ops/test_torch_free.py), and
importing transformers loads torch: so LazyTokenizer loads on the first /tokenize or /detokenize,
on the thread that serves it, and only the tokenizer and config, never the weights."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from api.tokenizer import TokenizerUnavailableError
from broker.errors import InvalidRequestError, KvferryError


class HFTokenizer:
    """A transformers tokenizer, used the way a worker uses it (workers/jobs/prompt.py)."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._vocab = len(tokenizer)  # added tokens included
        # A fast tokenizer used from two threads at once can raise "Already borrowed".
        self._lock = threading.Lock()

    def max_model_len(self) -> int:
        return self._max_model_len

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        with self._lock:
            ids = self._tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        return [int(t) for t in ids]

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool
    ) -> list[int]:
        if getattr(self._tokenizer, "chat_template", None) is None:
            raise InvalidRequestError("this model has no chat template: send a prompt", "messages")
        try:
            with self._lock:
                ids = self._tokenizer.apply_chat_template(
                    [dict(m) for m in messages],
                    add_generation_prompt=add_generation_prompt,
                    tokenize=True,
                    return_dict=False,
                )
        except Exception as exc:  # template errors (e.g. role order) are the request's fault
            raise InvalidRequestError(f"cannot apply the chat template: {exc}", "messages") from exc
        return [int(t) for t in ids]

    def decode(self, ids: Sequence[int]) -> str:
        bad = next((t for t in ids if not 0 <= t < self._vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary, [0, {self._vocab})", "tokens"
            )
        with self._lock:
            text: str = self._tokenizer.decode(list(ids))
        return text


class LazyTokenizer:
    """The model `name` resolves as a worker resolves it (workers/engine/model/loader.py); loaded
    on first use. A failed load is tried again on the next call: the files may appear (a worker
    converting the GGUF) or the fault may be transient."""

    def __init__(self, name: str, cache_dir: Path, max_model_len: int | None = None) -> None:
        self._name = name
        self._cache_dir = cache_dir
        self._cap = max_model_len  # Settings.max_model_len: the workers' cap, when set
        self._loaded: HFTokenizer | None = None
        self._lock = threading.Lock()

    def _get(self) -> HFTokenizer:
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    def _load(self) -> HFTokenizer:
        from transformers import AutoConfig, AutoTokenizer

        from workers.engine.model.loader import context_length, tokenizer_source

        try:
            directory, gguf_file = tokenizer_source(self._name, self._cache_dir)
            extra = {"gguf_file": gguf_file} if gguf_file else {}
            tokenizer = AutoTokenizer.from_pretrained(directory, **extra)
            length = context_length(AutoConfig.from_pretrained(directory, **extra))
        except (KvferryError, OSError, ValueError) as exc:
            raise TokenizerUnavailableError(f"model {self._name!r}: {exc}") from exc
        return HFTokenizer(tokenizer, min(length, self._cap) if self._cap else length)

    def max_model_len(self) -> int:
        return self._get().max_model_len()

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._get().encode(text, add_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool
    ) -> list[int]:
        return self._get().apply_chat_template(messages, add_generation_prompt)

    def decode(self, ids: Sequence[int]) -> str:
        return self._get().decode(ids)
