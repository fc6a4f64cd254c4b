"""SessionTokens: the exact token ids a session's last turn ended with (its prompt ids, then the
ids it generated), and a checkpoint for each conversation those ids spell the start of: the
turn's own (its messages and the reply text as the client got it) and the earlier turns it
built on. A turn whose messages continue one of those conversations reuses its ids instead of
re-tokenising the history: re-tokenising a generated reply need not give back the generated
ids, and every block after the first difference would miss.

The earlier checkpoints matter when a turn runs twice: a client that resends a turn after a lost
response (or a copy of a redelivered job) starts after its twin has ended and stored its own
conversation. The resent turn still continues the turn before, so it finds the same ids, and
gives the same answer; with only the latest conversation it would re-tokenise, and could not.

Stored in its own key (keys.session_tokens), msgpack-framed, the ids as a little-endian int32
array: ~4 bytes a token, against ~6 in the session record's JSON."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from broker.messages import ChatMessage

VERSION = 2
MAX_CHECKPOINTS = 16  # the turns a resent or edited turn can fall back to


@dataclass(frozen=True, slots=True)
class Checkpoint:
    digest: bytes  # conversation_digest() of a conversation, its last reply included
    num_messages: int
    num_tokens: int  # its ids are token_ids[:num_tokens]


@dataclass(frozen=True, slots=True)
class SessionTokens:
    model: str
    token_ids: tuple[int, ...]
    checkpoints: tuple[Checkpoint, ...]  # oldest first; the last spells all of token_ids

    def head_for(self, model: str, messages: Sequence[ChatMessage]) -> tuple[int, ...] | None:
        """The ids of the longest stored conversation that `messages` start with and add at
        least one message to; None when there is none."""
        if model != self.model:
            return None
        for cp in reversed(self.checkpoints):
            if 0 < cp.num_messages < len(messages) and (
                conversation_digest(model, messages[: cp.num_messages]) == cp.digest
            ):
                return self.token_ids[: cp.num_tokens]
        return None


def after_turn(
    previous: SessionTokens | None, model: str, conversation: Sequence[ChatMessage], token_ids: Sequence[int]
) -> SessionTokens:
    """The session's tokens once a turn ended with `token_ids`, spelling `conversation`. The
    previous checkpoints stay while these ids start with theirs (the turn reused them) and their
    conversations are shorter than this one."""
    ids = tuple(token_ids)
    kept: tuple[Checkpoint, ...] = ()
    if previous is not None and previous.model == model:
        kept = tuple(
            cp
            for cp in previous.checkpoints
            if cp.num_messages < len(conversation)
            and cp.num_tokens <= len(ids)
            and previous.token_ids[: cp.num_tokens] == ids[: cp.num_tokens]
        )
    last = Checkpoint(conversation_digest(model, conversation), len(conversation), len(ids))
    return SessionTokens(model, ids, (*kept, last)[-MAX_CHECKPOINTS:])


def conversation_digest(model: str, messages: Sequence[ChatMessage]) -> bytes:
    """Stable across processes: length-prefixed fields, so no two conversations spell the same."""
    h = hashlib.blake2b(digest_size=16)
    h.update(model.encode())
    for m in messages:
        parts = [m.role, m.content]
        # tool fields only when present: a plain conversation's digest stays what it was
        for call in m.tool_calls:
            parts += ["\x00call", call.id, call.name, call.arguments]
        if m.tool_call_id is not None:
            parts += ["\x00answers", m.tool_call_id]
        for part in (p.encode("utf-8", "surrogatepass") for p in parts):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    return h.digest()


def encode(tokens: SessionTokens) -> bytes:
    ids = struct.pack(f"<{len(tokens.token_ids)}i", *tokens.token_ids)
    marks = [[cp.digest, cp.num_messages, cp.num_tokens] for cp in tokens.checkpoints]
    return msgpack.packb([VERSION, tokens.model, ids, marks])


def decode(raw: bytes) -> SessionTokens | None:
    """None when unreadable or of another layout: the turn then re-tokenises (nothing is lost)."""
    try:
        version, model, ids, marks = msgpack.unpackb(raw)
        if version != VERSION or len(ids) % 4:
            return None
        token_ids = struct.unpack(f"<{len(ids) // 4}i", ids)
        checkpoints = tuple(Checkpoint(bytes(d), int(n), int(t)) for d, n, t in marks)
        if any(not 0 < cp.num_tokens <= len(token_ids) for cp in checkpoints):
            return None
        return SessionTokens(str(model), token_ids, checkpoints)
    except (ValueError, TypeError, struct.error, msgpack.UnpackException):
        return None
