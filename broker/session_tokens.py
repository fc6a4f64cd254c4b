"""SessionTokens: the exact token ids a session's last turn ended with (its prompt ids, then the
ids it generated) and a digest of the conversation they spell (the turn's messages and the reply
text as the client got it). The next turn whose messages start with exactly that conversation
reuses these ids instead of re-tokenising the history: re-tokenising a generated reply need not
give back the generated ids, and every block after the first difference would miss.

Stored in its own key (keys.session_tokens), msgpack-framed, the ids as a little-endian int32
array: ~4 bytes a token, against ~6 in the session record's JSON."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from broker.messages import ChatMessage

VERSION = 1


@dataclass(frozen=True, slots=True)
class SessionTokens:
    model: str
    digest: bytes  # conversation_digest() of the messages the ids spell, the reply included
    num_messages: int
    token_ids: tuple[int, ...]


def conversation_digest(model: str, messages: Sequence[ChatMessage]) -> bytes:
    """Stable across processes: length-prefixed fields, so no two conversations spell the same."""
    h = hashlib.blake2b(digest_size=16)
    h.update(model.encode())
    for m in messages:
        for part in (m.role.encode(), m.content.encode("utf-8", "surrogatepass")):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    return h.digest()


def encode(tokens: SessionTokens) -> bytes:
    ids = struct.pack(f"<{len(tokens.token_ids)}i", *tokens.token_ids)
    return msgpack.packb([VERSION, tokens.model, tokens.digest, tokens.num_messages, ids])


def decode(raw: bytes) -> SessionTokens | None:
    """None when unreadable or of another layout: the turn then re-tokenises (nothing is lost)."""
    try:
        version, model, digest, num_messages, ids = msgpack.unpackb(raw)
        if version != VERSION or len(ids) % 4:
            return None
        return SessionTokens(
            str(model), bytes(digest), int(num_messages), struct.unpack(f"<{len(ids) // 4}i", ids)
        )
    except (ValueError, TypeError, struct.error, msgpack.UnpackException):
        return None
