"""Prompt token ids for a job, with the model's own tokenizer and chat template."""

from __future__ import annotations

from typing import Any

from broker.errors import InvalidRequestError
from broker.messages import GenerateJob


def prompt_token_ids(job: GenerateJob, tokenizer: Any) -> list[int]:
    if job.prompt_token_ids:
        return list(job.prompt_token_ids)
    if job.endpoint == "chat":
        if not job.messages:
            raise InvalidRequestError("'messages' must be a non-empty list", "messages")
        if getattr(tokenizer, "chat_template", None) is None:
            raise InvalidRequestError("this model has no chat template: use /v1/completions", "messages")
        messages = [{"role": m.role, "content": m.content} for m in job.messages]
        try:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as exc:  # template errors (e.g. role order) are the request's fault
            raise InvalidRequestError(f"cannot apply the chat template: {exc}", "messages") from exc
        return [int(t) for t in ids]
    if not job.prompt:
        raise InvalidRequestError("the prompt is empty", "prompt")
    return [int(t) for t in tokenizer(job.prompt)["input_ids"]]
