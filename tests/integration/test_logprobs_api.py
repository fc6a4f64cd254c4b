"""Logprobs, echo and several prompts through the real stack (api -> queue -> worker -> engine):
the shapes lm-eval and the openai client read, each value within 1e-4 of an HF forward of the
same ids, greedy tokens exact, streamed and not, and through /v1/jobs."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI

from tests.integration.conftest import MODEL, WorkerProcess

TOL = 1e-4
Forward = Callable[[list[int]], torch.Tensor]


@pytest.fixture(scope="module")
def client(api_url: str, two_workers: tuple[WorkerProcess, WorkerProcess]) -> OpenAI:
    return OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def forward(tiny_model_dir: Path) -> Forward:
    """HF's log-softmax over the same weights: row i predicts ids[i + 1]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()

    def run(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return run


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(100, 49152) for _ in range(20)]  # a shared head, as a task's few-shot
    return [shared + [rng.randrange(100, 49152) for _ in range(5 + 3 * i)] for i in range(n)]


def _loglikelihood(choice: dict[str, Any], ctxlen: int) -> tuple[float, bool]:
    """lm-eval's parse_logprobs for local-completions, as it reads a choice."""
    logprobs = choice["logprobs"]
    lps = logprobs["token_logprobs"][ctxlen:-1]
    tops = logprobs["top_logprobs"][ctxlen:-1]
    return sum(lps), all(lp == max(top.values()) for lp, top in zip(lps, tops, strict=True))


@pytest.mark.fp32_only(reason="each logprob within 1e-4 of HF fp32's forward")
def test_echo_logprobs_of_several_token_prompts_as_lm_eval_reads_them(
    api_url: str, two_workers: object, forward: Forward, tiny_reference: Any
) -> None:
    prompts = _prompts(3, seed=1)
    body = {"model": MODEL, "prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    reply = httpx.post(f"{api_url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert "," not in reply.headers["X-Kvferry-Worker"], "a request's prompts run on one worker"
    doc = reply.json()
    assert [c["index"] for c in doc["choices"]] == [0, 1, 2]
    assert doc["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)
    assert doc["usage"]["completion_tokens"] == 3
    for prompt, choice in zip(prompts, doc["choices"], strict=True):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(prompt) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        generated = tiny_reference(prompt, 1)
        ref = forward(prompt + generated)
        ids = prompt + generated
        for i in range(1, len(ids)):
            assert abs(lp["token_logprobs"][i] - float(ref[i - 1, ids[i]])) <= TOL, i
            (best,) = [
                v for k, v in lp["top_logprobs"][i].items() if v == max(lp["top_logprobs"][i].values())
            ]
            assert abs(best - float(ref[i - 1].max())) <= TOL
        assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
        # lm-eval's reading: the continuation is the prompt's last 4 tokens
        total, greedy = _loglikelihood(choice, len(prompt) - 4)
        want = sum(float(ref[i - 1, ids[i]]) for i in range(len(prompt) - 4, len(prompt)))
        assert abs(total - want) <= 4 * TOL
        assert greedy == all(int(ref[i - 1].argmax()) == ids[i] for i in range(len(prompt) - 4, len(prompt)))


def test_echo_with_max_tokens_0_returns_the_prompt_alone(
    api_url: str, two_workers: object, tokenizer: Any
) -> None:
    text = "The quick brown fox jumps over the lazy dog"
    body = {"model": MODEL, "prompt": text, "echo": True, "logprobs": 2, "max_tokens": 0}
    doc = httpx.post(f"{api_url}/v1/completions", json=body, timeout=120).json()
    (choice,) = doc["choices"]
    ids = tokenizer(text)["input_ids"]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids) and doc["usage"]["completion_tokens"] == 0
    assert all(len(top) in (2, 3) for top in choice["logprobs"]["top_logprobs"][1:])


@pytest.mark.fp32_only(reason="each logprob within 1e-4 of HF fp32's forward")
def test_chat_logprobs_streamed_and_not_equal_an_hf_forward(
    client: OpenAI, tokenizer: Any, forward: Forward, tiny_reference: Any
) -> None:
    messages = [{"role": "user", "content": "logprobs, please"}]
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_body": {"ignore_eos": True},
    }
    reply = client.chat.completions.create(**args)
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 6
    ids = prompt + tiny_reference(prompt, 6)
    ref = forward(ids)
    for j, entry in enumerate(content):
        row = ref[len(prompt) + j - 1]
        assert abs(entry.logprob - float(row[ids[len(prompt) + j]])) <= TOL
        assert len(entry.top_logprobs) == 3
        want = row.topk(3).values.tolist()
        assert all(abs(t.logprob - v) <= TOL for t, v in zip(entry.top_logprobs, want, strict=True))
        assert entry.bytes == list(entry.token.encode())

    streamed = []
    for chunk in client.chat.completions.create(**args, stream=True):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed.extend(chunk.choices[0].logprobs.content)
    # the same tokens; values within float noise (the second may hit the first's cached prompt)
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(abs(s.logprob - e.logprob) <= TOL for s, e in zip(streamed, content, strict=True))


def test_streamed_echo_starts_with_the_prompt(api_url: str, two_workers: object) -> None:
    body = {"model": MODEL, "prompt": "echo me", "echo": True, "logprobs": 0, "max_tokens": 3, "stream": True}
    chunks = []
    with httpx.stream("POST", f"{api_url}/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    first = chunks[0]["choices"][0]
    assert first["text"] == "echo me" and first["logprobs"]["token_logprobs"][0] is None
    tokens = [t for c in chunks for t in (c["choices"][0]["logprobs"] or {}).get("tokens", [])]
    assert len(tokens) == len(first["logprobs"]["tokens"]) + 3


def test_a_queued_job_keeps_its_logprobs(api_url: str, two_workers: object) -> None:
    body = {"model": MODEL, "prompt": [5, 6, 7, 8], "logprobs": 2, "max_tokens": 4, "temperature": 0}
    job = httpx.post(
        f"{api_url}/v1/jobs", json={"endpoint": "/v1/completions", "body": body}, timeout=30
    ).json()
    deadline = time.monotonic() + 120
    while (view := httpx.get(f"{api_url}/v1/jobs/{job['id']}", timeout=30).json())["status"] != "succeeded":
        assert time.monotonic() < deadline and view["status"] in ("queued", "running"), view
        time.sleep(0.1)
    lp = view["result"]["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 4 and all(v is not None for v in lp["token_logprobs"])
    several = {"endpoint": "/v1/completions", "body": {**body, "prompt": [[5, 6], [7, 8]]}}
    refused = httpx.post(f"{api_url}/v1/jobs", json=several, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "body.prompt"
