"""The whole path with real parts: openai client -> api -> Redis queue -> Celery worker -> engine."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from tests.integration.conftest import MODEL, WorkerProcess

Reference = Callable[[list[int], int], list[int]]
SYSTEM = "You answer briefly. " * 6
NO_EOS = {"ignore_eos": True}  # random weights: never stop early, so lengths match HF exactly


@pytest.fixture(scope="module")
def client(api_url: str, two_workers: tuple[WorkerProcess, WorkerProcess]) -> OpenAI:
    return OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _expected_text(
    tokenizer: object, tiny_reference: Reference, messages: list[dict[str, str]], n: int
) -> str:
    prompt = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return str(tokenizer.decode(tiny_reference(prompt, n), skip_special_tokens=True))  # type: ignore[attr-defined]


@pytest.mark.fp32_only(reason="the reply's tokens equal HF fp32 generate's")
def test_openai_client_chat_is_token_exact(
    client: OpenAI, tokenizer: object, tiny_reference: Reference
) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first"}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0,  # type: ignore[arg-type]
        extra_body=NO_EOS,
    )
    assert reply.choices[0].message.content == _expected_text(tokenizer, tiny_reference, messages, 10)
    assert reply.usage is not None and reply.usage.completion_tokens == 10
    # The same system prompt again: its blocks are served from a worker's pool (or computed again on
    # the other worker; ask twice more so that at least one lands where the blocks are).
    follow = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "second"}]
    cached = []
    for _ in range(3):
        again = client.chat.completions.create(
            model=MODEL,
            messages=follow,
            max_tokens=6,
            temperature=0,  # type: ignore[arg-type]
            extra_body=NO_EOS,
        )
        assert again.choices[0].message.content == _expected_text(tokenizer, tiny_reference, follow, 6)
        assert again.usage is not None and again.usage.prompt_tokens_details is not None
        cached.append(again.usage.prompt_tokens_details.cached_tokens)
    assert max(cached) > 0 and all(c % 16 == 0 for c in cached)


@pytest.mark.fp32_only(reason="the reply's tokens equal HF fp32 generate's")
def test_openai_client_streaming_is_token_exact(
    client: OpenAI, tokenizer: object, tiny_reference: Reference
) -> None:
    messages = [{"role": "user", "content": "stream me"}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_EOS,
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == _expected_text(tokenizer, tiny_reference, messages, 12)
    assert finish == "length" and usage is not None and usage.completion_tokens == 12


@pytest.mark.fp32_only(reason="the reply's tokens equal HF fp32 generate's")
def test_completions_endpoint(client: OpenAI, tokenizer: object, tiny_reference: Reference) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, extra_body=NO_EOS
    )
    ids = tokenizer("Once upon a time")["input_ids"]  # type: ignore[operator]
    expected = tokenizer.decode(tiny_reference(ids, 8), skip_special_tokens=True)  # type: ignore[attr-defined]
    assert reply.choices[0].text == expected


@pytest.mark.fp32_only(reason="the reply's tokens equal HF fp32 generate's")
def test_jobs_submit_and_poll(
    api_url: str,
    two_workers: tuple[WorkerProcess, WorkerProcess],
    tokenizer: object,
    tiny_reference: Reference,
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "queued"}],
        "max_tokens": 7,
        "temperature": 0,
        "ignore_eos": True,
    }
    submitted = httpx.post(
        f"{api_url}/v1/jobs", json={"endpoint": "/v1/chat/completions", "body": body}, timeout=30
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        job = httpx.get(f"{api_url}/v1/jobs/{job_id}", timeout=30).json()
        if job["status"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert job["status"] == "succeeded", job
    assert job["worker"] in {w.name for w in two_workers}
    text = job["result"]["choices"][0]["message"]["content"]
    assert text == _expected_text(tokenizer, tiny_reference, body["messages"], 7)  # type: ignore[arg-type]


def test_bad_input_gets_4xx(client: OpenAI, api_url: str) -> None:
    with pytest.raises(NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    with pytest.raises(BadRequestError, match="context"):  # found by the worker: 1,024-token context
        client.completions.create(model=MODEL, prompt="word " * 1100, max_tokens=4)
    assert httpx.post(f"{api_url}/v1/chat/completions", json={"model": MODEL}, timeout=10).status_code == 400
    bad_json = httpx.post(
        f"{api_url}/v1/chat/completions",
        content=b"{nope",
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert bad_json.status_code == 400 and "error" in bad_json.json()


def test_responses_name_the_worker(api_url: str, two_workers: tuple[WorkerProcess, WorkerProcess]) -> None:
    body = {"model": MODEL, "prompt": "which worker", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    plain = httpx.post(f"{api_url}/v1/completions", json=body, timeout=60)
    assert plain.headers["x-kvferry-worker"] in {w.name for w in two_workers}
    with httpx.stream(
        "POST", f"{api_url}/v1/completions", json={**body, "stream": True}, timeout=60
    ) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data: {")]
    assert '"x_kvferry"' in lines[-1] and any(w.name in lines[-1] for w in two_workers)
