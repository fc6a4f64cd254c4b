"""Prompt-prefix digests for cache-aware routing without a tokenizer at the api.

A request's digests chain over its messages (chat) or fixed-size chunks of its text (completion):
digest k covers everything up to message k. A worker publishes the digests of what it served,
including its own reply as the next message, so a conversation's next turn (which resends the
history) finds the worker holding its blocks by the longest run of digests it holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from broker.messages import ChatMessage

TEXT_CHUNK_CHARS = 256
_ROOT = b"kvferry/prefix/v1"


def _step(parent: bytes, *parts: str) -> bytes:
    h = hashlib.sha256(parent)
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()[:16]


def chat_digests(model: str, tenant: str, messages: Sequence[ChatMessage]) -> list[str]:
    digest = _step(_ROOT, model, tenant, "chat")
    out = []
    for m in messages:
        digest = _step(digest, m.role, m.content)
        out.append(digest.hex())
    return out


def text_digests(model: str, tenant: str, text: str) -> list[str]:
    digest = _step(_ROOT, model, tenant, "text")
    out = []
    for start in range(0, len(text) - TEXT_CHUNK_CHARS + 1, TEXT_CHUNK_CHARS):
        digest = _step(digest, text[start : start + TEXT_CHUNK_CHARS])
        out.append(digest.hex())
    return out
