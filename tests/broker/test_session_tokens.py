"""SessionTokens on their own: which stored conversation a turn continues, what a turn keeps of
the checkpoints before it, and the encoding."""

from __future__ import annotations

from broker.messages import ChatMessage
from broker.sessions import tokens as session_tokens
from broker.sessions.tokens import SessionTokens, after_turn

M = "m"


def _conv(*texts: str) -> tuple[ChatMessage, ...]:
    roles = ("user", "assistant")
    return tuple(ChatMessage(roles[i % 2], t) for i, t in enumerate(texts))


def test_a_turn_continues_the_longest_stored_conversation_it_starts_with() -> None:
    t1 = after_turn(None, M, _conv("q1", "a1"), [1, 2, 3])
    t2 = after_turn(t1, M, _conv("q1", "a1", "q2", "a2"), [1, 2, 3, 4, 5])
    assert [cp.num_messages for cp in t2.checkpoints] == [2, 4]
    assert t2.head_for(M, _conv("q1", "a1", "q2", "a2", "q3")) == (1, 2, 3, 4, 5)
    assert t2.head_for(M, _conv("q1", "a1", "q2")) == (1, 2, 3)  # turn 2 again: turn 1's ids
    assert t2.head_for(M, _conv("q1", "a1", "q2", "edited", "q3")) == (1, 2, 3)
    assert t2.head_for(M, _conv("q1", "a1")) is None  # adds nothing to any stored conversation
    assert t2.head_for(M, _conv("other", "a1", "q2")) is None
    assert t2.head_for("another-model", _conv("q1", "a1", "q2")) is None


def test_a_turn_that_did_not_reuse_the_ids_before_drops_their_checkpoints() -> None:
    t1 = after_turn(None, M, _conv("q1", "a1"), [1, 2, 3])
    retokenised = after_turn(t1, M, _conv("q1", "a1", "q2", "a2"), [1, 9, 3, 4])
    assert [cp.num_messages for cp in retokenised.checkpoints] == [4]
    shorter = after_turn(t1, M, _conv("q1", "a1"), [1, 2, 3])  # the same turn again
    assert [cp.num_messages for cp in shorter.checkpoints] == [2]
    assert (
        after_turn(t1, "another-model", _conv("q1", "a1", "q2", "a2"), [1, 2, 3, 4]).checkpoints[0].num_tokens
        == 4
    )


def test_checkpoints_are_bounded_and_survive_the_encoding() -> None:
    tokens: SessionTokens | None = None
    conv: tuple[str, ...] = ()
    ids: list[int] = []
    for turn in range(session_tokens.MAX_CHECKPOINTS + 5):
        conv = (*conv, f"q{turn}", f"a{turn}")
        ids = [*ids, turn, turn]
        tokens = after_turn(tokens, M, _conv(*conv), ids)
    assert tokens is not None and len(tokens.checkpoints) == session_tokens.MAX_CHECKPOINTS
    assert session_tokens.decode(session_tokens.encode(tokens)) == tokens
    assert session_tokens.decode(b"\x00junk") is None
