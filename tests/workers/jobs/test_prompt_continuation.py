"""continuation_ids: a session's next turn reuses the ids its last turn ended with, also when the
model generated special tokens that the reply's text (what the client sends back) leaves out; any
other difference re-tokenises. SmolLM2's tokenizer and chat template."""

from __future__ import annotations

import random
from typing import Any

from workers.jobs.prompt import continuation_ids

FILE_SEP = 5  # "<file_sep>": an added token that the detokenizer skips
SYSTEM = {"role": "system", "content": "You are a careful assistant."}
USER = {"role": "user", "content": "first question"}


def render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


def ids_of(tokenizer: Any, text: str) -> list[int]:
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def turn_ids(tokenizer: Any, reply: list[int]) -> tuple[tuple[int, ...], str, str]:
    """(the ids the turn ended with, the next turn's prompt text, that text up to the seam: the
    first turn's prompt and its reply as the client saw it)."""
    prompt = ids_of(tokenizer, render(tokenizer, [SYSTEM, USER]))
    seen = tokenizer.decode(reply, skip_special_tokens=True).rstrip("\ufffd")  # as the engine's detokenizer
    history = [SYSTEM, USER, {"role": "assistant", "content": seen}, {"role": "user", "content": "next"}]
    before_seam = render(tokenizer, [SYSTEM, USER]) + seen
    return (*prompt, *reply), render(tokenizer, history), before_seam


def test_a_plain_reply_continues(tokenizer: Any) -> None:
    reply = ids_of(tokenizer, " The sky is blue because of scattering.")
    head, text, before_seam = turn_ids(tokenizer, reply)
    assert continuation_ids(tokenizer, head, text) == [*head, *ids_of(tokenizer, text[len(before_seam) :])]


def test_special_tokens_the_reply_left_out_still_continue(tokenizer: Any) -> None:
    words = ids_of(tokenizer, " The sky is blue because of scattering.")
    for reply in ([*words[:3], FILE_SEP, *words[3:]], [*words, FILE_SEP], [FILE_SEP, *words]):
        head, text, before_seam = turn_ids(tokenizer, reply)
        assert "<file_sep>" not in text
        got = continuation_ids(tokenizer, head, text)
        assert got == [*head, *ids_of(tokenizer, text[len(before_seam) :])], reply


def test_any_other_difference_re_tokenises(tokenizer: Any) -> None:
    words = ids_of(tokenizer, " The sky is blue because of scattering.")
    head, text, _ = turn_ids(tokenizer, [*words[:3], FILE_SEP, *words[3:]])
    assert continuation_ids(tokenizer, head, text.replace("blue", "grey")) is None
    assert continuation_ids(tokenizer, head, text.replace("scattering.", "scattering")) is None
    assert continuation_ids(tokenizer, head, text[: text.index("<|im_end|>")]) is None  # nothing after it


def test_an_incomplete_character_at_the_end_still_continues(tokenizer: Any) -> None:
    byte = next(i for i in range(256, 49152) if tokenizer.decode([i]) == "\ufffd")  # half a character
    reply = [*ids_of(tokenizer, " The sky is blue."), byte]
    head, text, _ = turn_ids(tokenizer, reply)
    before_seam = render(tokenizer, [SYSTEM, USER]) + tokenizer.decode(reply[:-1])
    assert "\ufffd" not in text  # the detokenizer leaves it out until it completes
    assert continuation_ids(tokenizer, head, text) == [*head, *ids_of(tokenizer, text[len(before_seam) :])]


def test_random_replies_all_continue(tokenizer: Any) -> None:
    """Replies of uniformly random ids (what the tests' tiny random model writes): special tokens
    and split characters anywhere; every one of them continues."""
    rng = random.Random(7)
    for _ in range(60):
        reply = [rng.randrange(49152) for _ in range(300)]
        head, text, _ = turn_ids(tokenizer, reply)
        got = continuation_ids(tokenizer, head, text)
        assert got is not None and got[: len(head)] == list(head), reply
