"""Exact-token session reuse: a turn whose messages continue the session's last conversation
reuses the ids that turn ended with (the generated ones, not a re-tokenised reply); an edited
history re-tokenises. Both token-exact against HF generate on the prompt ids the worker used."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from broker import keys
from broker.messages import GenerateResult, SessionRecord
from broker.sessions import store as session_store
from broker.sessions import tokens as session_tokens
from broker.sessions.tokens import Checkpoint, SessionTokens
from tests.integration.conftest import MODEL, WorkerProcess
from tests.integration.jobs import chat as _chat
from tests.integration.jobs import wait_settled

Reference = Callable[[list[int], int], list[int]]
SYSTEM = "You answer in one short sentence, and you never repeat yourself. " * 3


def _used_prompt(client: redis.Redis, session: str, result: GenerateResult) -> list[int]:
    """The prompt ids the worker ran: the session record holds them, then the turn's output."""
    record = session_store.load(client, "", session)
    assert isinstance(record, SessionRecord)
    assert list(record.token_ids[result.usage.prompt_tokens :]) == list(result.token_ids)
    return list(record.token_ids[: result.usage.prompt_tokens])


def _template(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(t) for t in ids]


def test_matching_history_reuses_the_generated_ids_and_an_edited_one_retokenises(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    w1, w2 = two_workers
    session = f"exact-{uuid.uuid4().hex[:8]}"
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first question"}]
    r1 = _chat(celery_app, turn1, session, w1.queue)
    ended = [*_template(tokenizer, turn1), *r1.token_ids]
    stored = session_store.load_tokens(redis_client, "", session)  # saved before the answer
    assert isinstance(stored, SessionTokens) and list(stored.token_ids) == ended
    assert [cp.num_messages for cp in stored.checkpoints] == [3]
    wait_settled(redis_client, "", session)  # its blocks reach Redis just after the answer

    # The same conversation, the reply as the client got it: the ids turn 1 ended with, reused.
    turn2 = [*turn1, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "and then?"}]
    r2 = _chat(celery_app, turn2, session, w2.queue)  # another worker: the tokens live in Redis
    prompt2 = _used_prompt(redis_client, session, r2)
    assert prompt2[: len(ended)] == ended
    assert list(r2.token_ids) == tiny_reference(prompt2, 8)
    assert r2.usage.cached_tokens >= (len(ended) - 1) // 16 * 16, r2.usage

    # A reply often re-tokenises as generated; to tell reuse from re-tokenising, spell the stored
    # reply one character a token (the same text, ids no tokenizer would give): they are reused.
    wait_settled(redis_client, "", session)  # else turn 2's own write after its answer can land last
    stored = session_store.load_tokens(redis_client, "", session)
    assert stored is not None
    odd = [t for c in r2.text for t in tokenizer(c, add_special_tokens=False)["input_ids"]]
    assert tokenizer.decode(odd) == r2.text and len(odd) > len(r2.token_ids)
    spelled = (*prompt2, *odd)
    respelled = replace(stored.checkpoints[-1], num_tokens=len(spelled))
    redis_client.set(
        keys.session_tokens("", session),
        session_tokens.encode(
            replace(stored, token_ids=spelled, checkpoints=(*stored.checkpoints[:-1], respelled))
        ),
    )
    turn3 = [*turn2, {"role": "assistant", "content": r2.text}, {"role": "user", "content": "sure?"}]
    r3 = _chat(celery_app, turn3, session, w1.queue)
    prompt3 = _used_prompt(redis_client, session, r3)
    assert prompt3[: len(spelled)] == list(spelled) and prompt3 != _template(tokenizer, turn3)
    assert list(r3.token_ids) == tiny_reference(prompt3, 8)

    # An edited reply: the conversations that include it are not stored, so the history after
    # the last one that does not (turn 1's) re-tokenises.
    edited = [*turn3[:4], {"role": "assistant", "content": r2.text + " (edited)"}, turn3[5]]
    turn4 = [*edited, {"role": "assistant", "content": r3.text}, {"role": "user", "content": "why?"}]
    r4 = _chat(celery_app, turn4, session, w1.queue)
    prompt4 = _used_prompt(redis_client, session, r4)
    assert prompt4[: len(ended)] == ended
    assert tokenizer.decode(prompt4) == tokenizer.decode(_template(tokenizer, turn4))
    assert list(r4.token_ids) == tiny_reference(prompt4, 8)

    # An edited earlier message (the system prompt) re-tokenises too.
    turn5 = [
        {"role": "system", "content": SYSTEM + "!"},
        *turn4[1:],
        {"role": "assistant", "content": r4.text},
    ]
    turn5.append({"role": "user", "content": "really?"})
    r5 = _chat(celery_app, turn5, session, w1.queue)
    prompt5 = _used_prompt(redis_client, session, r5)
    assert prompt5 == _template(tokenizer, turn5)
    assert list(r5.token_ids) == tiny_reference(prompt5, 8)


def test_deleted_session_loses_its_tokens_and_a_turn_begun_before_cannot_bring_them_back(
    redis_client: redis.Redis,
) -> None:
    session = f"gone-{uuid.uuid4().hex[:8]}"
    began = time.time()
    record = SessionRecord(session, "", MODEL, (1, 2, 3), (), "w", began, 1)
    tokens = SessionTokens(MODEL, (1, 2, 3), (Checkpoint(b"d" * 16, 3, 3),))
    assert session_store.save(redis_client, record, 60, began, tokens)
    assert session_store.load_tokens(redis_client, "", session) == tokens
    assert session_store.delete(redis_client, "", session)
    assert redis_client.exists(keys.session_tokens("", session)) == 0
    assert session_store.load_tokens(redis_client, "", session) is None
    late = SessionRecord(session, "", MODEL, (1, 2, 3, 4), (), "w", time.time(), 2)
    assert not session_store.save(redis_client, late, 60, began, tokens)  # began before the DELETE
    assert redis_client.exists(keys.session_tokens("", session)) == 0
    # A turn without exact tokens (say, a completion) drops the old ones: they spell no longer
    # the session's latest turn.
    other = f"plain-{uuid.uuid4().hex[:8]}"
    first = SessionRecord(other, "", MODEL, (1,), (), "w", time.time(), 1)
    assert session_store.save(redis_client, first, 60, None, tokens)
    second = SessionRecord(other, "", MODEL, (1, 2), (), "w", time.time() + 1, 2)
    assert session_store.save(redis_client, second, 60)
    assert redis_client.exists(keys.session_tokens("", other)) == 0


def test_a_turn_sent_again_after_its_twin_ended_gets_the_same_answer(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    """A client that lost a turn's response sends it again; its first copy has ended and stored
    its own conversation by then. The copy still continues the turn before, reuses the same ids
    and answers the same (it once re-tokenised the history, and answered something else)."""
    w1, w2 = two_workers
    session = f"twin-{uuid.uuid4().hex[:8]}"
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "say something odd"}]
    r1 = _chat(celery_app, turn1, session, w1.queue)
    turn2 = [*turn1, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "more"}]
    first = _chat(celery_app, turn2, session, w1.queue)
    prompt = _used_prompt(redis_client, session, first)
    again = _chat(celery_app, turn2, session, w2.queue)
    assert _used_prompt(redis_client, session, again) == prompt
    assert list(again.token_ids) == list(first.token_ids) == tiny_reference(prompt, 8)
    stored = session_store.load_tokens(redis_client, "", session)
    assert stored is not None and [cp.num_messages for cp in stored.checkpoints] == [3, 5]
