"""Prompt token ids for a job, with the model's own tokenizer and chat template.

A session's next turn reuses the exact ids its last turn ended with (broker/sessions/tokens.py)
when its messages start with exactly that conversation (or an earlier turn's, which those ids
start with), and tokenises only the text after it:
re-tokenising a generated reply need not give back the ids the model generated, so every block
from the first difference on would miss. The special tokens a reply's text leaves out do not
count as a difference (continuation_ids). Anything else that does not match re-tokenises it all."""

from __future__ import annotations

import re
from typing import Any

from broker.errors import InvalidRequestError
from broker.messages import GenerateJob
from broker.sessions.tokens import SessionTokens
from workers.jobs.chat_render import template_inputs


def prompt_token_ids(job: GenerateJob, tokenizer: Any, stored: SessionTokens | None = None) -> list[int]:
    if job.prompt_token_ids:
        return list(job.prompt_token_ids)
    if job.endpoint == "chat":
        if not job.messages:
            raise InvalidRequestError("'messages' must be a non-empty list", "messages")
        if getattr(tokenizer, "chat_template", None) is None:
            raise InvalidRequestError("this model has no chat template: use /v1/completions", "messages")
        messages, extra = template_inputs(job, tokenizer)
        try:
            head = stored.head_for(job.model, job.messages) if stored is not None else None
            if head is not None:
                text = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False, **extra
                )
                reused = continuation_ids(tokenizer, head, text)
                if reused is not None:
                    return reused
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False, **extra
            )
        except Exception as exc:  # template errors (e.g. role order) are the request's fault
            raise InvalidRequestError(f"cannot apply the chat template: {exc}", "messages") from exc
        return [int(t) for t in ids]
    if not job.prompt:
        raise InvalidRequestError("the prompt is empty", "prompt")
    return [int(t) for t in tokenizer(job.prompt)["input_ids"]]


def continuation_ids(tokenizer: Any, head_ids: tuple[int, ...], text: str) -> list[int] | None:
    """head_ids + the ids of what `text` (the rendered template) adds after them; None unless
    head_ids spell the start of `text` (special tokens the client never saw aside: see
    `head_end`) and the seam lies at a special token (so tokenising the rest alone splits it as
    tokenising all of it would: the tokenizer never merges across an added token)."""
    if not head_ids:
        return None
    head = tokenizer.decode(list(head_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    added: dict[str, int] = tokenizer.get_added_vocab()
    seam = len(head) if text.startswith(head) else head_end(head, text, added)
    if seam is None or seam == len(text):
        return None  # an edited history, a stop string cut from the reply, a split character
    rest = text[seam:]
    if head_ids[-1] not in added.values() and not any(rest.startswith(t) for t in added):
        return None
    suffix = tokenizer(rest, add_special_tokens=False)["input_ids"]
    return [*head_ids, *(int(t) for t in suffix)]


def head_end(head: str, text: str, added: dict[str, int]) -> int | None:
    """Where `head` (the stored ids, decoded with their special tokens) ends in `text`, when text
    lacks some of head's special tokens or U+FFFD characters; None when anything else differs.

    A reply's text leaves out the special tokens the model generated (the detokenizer skips them)
    and an incomplete UTF-8 character at its end, so the history a client sends back lacks them,
    while the ids its session stored hold them: they are the model's own. The conversation digest
    (SessionTokens.head_for) already says the messages are those the ids were stored for; here
    every other character must match."""
    specials = "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))
    pieces = re.split(f"({specials + '|' if specials else ''}\ufffd+)", head)
    at = 0
    for i, piece in enumerate(pieces):
        if text.startswith(piece, at):
            at += len(piece)
        elif i % 2 == 0:  # text, not a special token: it differs
            return None
        elif piece[0] == "\ufffd":  # as many of them as text has here (maybe none)
            at += len(text[at : at + len(piece)]) - len(text[at : at + len(piece)].lstrip("\ufffd"))
    return at
