"""n, best_of and several prompts through the real stack: a job per prompt and choice, answered
as one response (streamed: interleaved chunks by choice index); greedy choices token-exact with
HF, seeded ones reproducible, a prompt's tokens counted once."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.integration.conftest import MODEL, WorkerProcess

NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def client(api_url: str, two_workers: tuple[WorkerProcess, WorkerProcess]) -> OpenAI:
    return OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_greedy_n_gives_n_identical_exact_choices(
    client: OpenAI, tokenizer: Any, tiny_reference: Any
) -> None:
    messages = [{"role": "user", "content": "three of the same"}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        n=3,
        max_tokens=5,
        temperature=0,
        extra_body=NO_EOS,  # type: ignore[arg-type]
    )
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    want = tokenizer.decode(tiny_reference(prompt, 5), skip_special_tokens=True)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content == want for c in reply.choices)
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == 15


def test_seeded_choices_differ_and_reproduce(api_url: str, two_workers: object) -> None:
    body = {
        "model": MODEL,
        "prompt": [11, 12, 13, 14],
        "n": 3,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 9,
    }
    response = httpx.post(f"{api_url}/v1/completions", json=body, timeout=120)
    assert "," not in response.headers["X-Kvferry-Worker"], "a prompt's choices run on one worker"
    first = response.json()
    again = httpx.post(f"{api_url}/v1/completions", json=body, timeout=120).json()
    assert "choices" in first, first
    texts = [c["text"] for c in first["choices"]]
    assert texts == [c["text"] for c in again["choices"]], "seed + choice index reproduces each choice"
    assert len(set(texts)) > 1, "each choice draws from its own generator"
    # choice i is the single request seeded seed + i
    one = httpx.post(f"{api_url}/v1/completions", json={**body, "n": 1, "seed": 10}, timeout=120).json()
    assert one["choices"][0]["text"] == texts[1]


def test_best_of_returns_the_likeliest_candidates(api_url: str, two_workers: object) -> None:
    body = {"model": MODEL, "prompt": [21, 22, 23], "max_tokens": 6, "temperature": 1.0, "seed": 4}
    every = httpx.post(f"{api_url}/v1/completions", json={**body, "n": 4, "logprobs": 0}, timeout=120).json()
    sums = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in every["choices"]}
    best = httpx.post(f"{api_url}/v1/completions", json={**body, "n": 1, "best_of": 4}, timeout=120).json()
    (choice,) = best["choices"]
    assert choice["logprobs"] is None, "logprobs only rank the candidates: not asked, not shown"
    assert choice["text"] == max(sums, key=lambda t: sums[t])
    assert best["usage"]["completion_tokens"] == 4 * 6 and best["usage"]["prompt_tokens"] == 3


def test_several_prompts_and_choices_stream_interleaved(
    api_url: str, two_workers: object, tiny_reference: Any
) -> None:
    prompts = [[31, 32, 33], [41, 42, 43, 44, 45]]
    body = {
        "model": MODEL,
        "prompt": prompts,
        "n": 2,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **NO_EOS,
    }
    texts: dict[int, str] = {}
    finished: dict[int, str] = {}
    usage = None
    with httpx.stream("POST", f"{api_url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
                if choice["finish_reason"]:
                    finished[choice["index"]] = choice["finish_reason"]
    assert sorted(texts) == [0, 1, 2, 3] and set(finished.values()) == {"length"}
    assert texts[0] == texts[1] and texts[2] == texts[3]  # greedy: a prompt's two choices agree
    assert usage is not None
    assert usage["prompt_tokens"] == 8 and usage["completion_tokens"] == 16


def test_refusals(api_url: str, two_workers: object) -> None:
    base = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    cases = [
        ({**base, "n": 2, "best_of": 1}, "best_of"),
        ({**base, "n": 1, "best_of": 2, "stream": True}, "best_of"),
        ({**base, "n": 2, "session_id": "s1"}, "n"),
        ({**base, "n": 65}, "n"),
    ]
    for body, param in cases:
        reply = httpx.post(f"{api_url}/v1/completions", json=body, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, (body, reply.text)
