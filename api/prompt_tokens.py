"""Turn a parsed request into prompt token ids with the model's own tokenizer and chat template."""

from __future__ import annotations

from typing import Any

from api.openai_schema import CompletionRequest
from broker.errors import InvalidRequestError


def prompt_token_ids(request: CompletionRequest, tokenizer: Any) -> list[int]:
    if request.is_chat:
        if getattr(tokenizer, "chat_template", None) is None:
            raise InvalidRequestError("this model has no chat template: use /v1/completions", "messages")
        try:
            ids = tokenizer.apply_chat_template(
                list(request.messages), add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as exc:  # template errors (e.g. role order) are the request's fault
            raise InvalidRequestError(f"cannot apply the chat template: {exc}", "messages") from exc
        return [int(t) for t in ids]
    if isinstance(request.prompt, tuple):
        return list(request.prompt)
    return [int(t) for t in tokenizer(request.prompt)["input_ids"]]
