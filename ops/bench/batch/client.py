"""The Batch API as `kvferry bench batch` and `kvferry chaos --batch` drive it: the official
`openai` client, unchanged, against the stack's api. Requests share one system prompt (a batch
of one task over many inputs, as users send them); each user turn is distinct."""

from __future__ import annotations

import json
import time
from typing import Any

from openai import OpenAI
from openai.types import Batch
from tqdm import tqdm

SYSTEM = "You are the batch benchmark's assistant. Answer in one short paragraph."
TERMINAL = {"completed", "failed", "expired", "cancelled"}
ENDPOINT = "/v1/chat/completions"
VLLM_FIELDS = ("ignore_eos", "cache_salt")  # fields the openai client has no argument for


def chat_body(model: str, text: str, max_tokens: int) -> dict[str, Any]:
    """A greedy chat request that runs to max_tokens (ignore_eos), so token counts are fixed."""
    return {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }


def client_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """A body as the openai client's create() takes it: vLLM's own fields go in extra_body."""
    extra = {k: body[k] for k in VLLM_FIELDS if k in body}
    return {**{k: v for k, v in body.items() if k not in VLLM_FIELDS}, "extra_body": extra}


def question(tag: str, i: int) -> str:
    return f"{tag} {i}: describe item number {i} of the catalogue and its use."


def jsonl(bodies: dict[str, dict[str, Any]], endpoint: str = ENDPOINT) -> bytes:
    """custom_id -> body, as the Batch API's input file."""
    lines = (
        json.dumps({"custom_id": cid, "method": "POST", "url": endpoint, "body": body})
        for cid, body in bodies.items()
    )
    return ("\n".join(lines) + "\n").encode()


def submit(client: OpenAI, data: bytes, endpoint: str = ENDPOINT, name: str = "batch.jsonl") -> Batch:
    uploaded = client.files.create(file=(name, data), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )


def wait(client: OpenAI, batch_id: str, timeout_s: float, desc: str, poll_s: float = 0.25) -> Batch:
    """Poll until the batch ends, a bar on its request counts; TimeoutError past timeout_s."""
    deadline = time.monotonic() + timeout_s
    batch = client.batches.retrieve(batch_id)
    with tqdm(total=None, desc=desc, unit="line", leave=False) as bar:
        while batch.status not in TERMINAL:
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} still {batch.status} after {timeout_s:.0f}s")
            counts = batch.request_counts
            if counts is not None:
                bar.total = counts.total or None
                bar.update(counts.completed + counts.failed - bar.n)
            time.sleep(poll_s)
            batch = client.batches.retrieve(batch_id)
    return batch


def wait_running(client: OpenAI, batch_id: str, timeout_s: float, lines: int = 1) -> Batch:
    """Until at least `lines` lines of the batch have finished (its workers are busy with it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        counts = batch.request_counts
        if batch.status in TERMINAL or (counts is not None and counts.completed >= lines):
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id}: no line finished within {timeout_s:.0f}s")
        time.sleep(0.1)


def read_lines(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    text = client.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def completion_tokens(lines: list[dict[str, Any]]) -> int:
    total = 0
    for line in lines:
        body = (line.get("response") or {}).get("body") or {}
        total += int((body.get("usage") or {}).get("completion_tokens", 0))
    return total


def content_of(line: dict[str, Any]) -> str | None:
    """A chat output line's answer text, or None for an error line."""
    response = line.get("response") or {}
    if response.get("status_code") != 200:
        return None
    choices = (response.get("body") or {}).get("choices") or []
    return str(choices[0]["message"]["content"]) if choices else None
