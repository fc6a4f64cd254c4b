"""vLLM's /tokenize and /detokenize with the real SmolLM2 tokenizer: the ids a worker would
compute (workers/jobs/prompt.py), a round trip back to the text, strict bodies, the tenant key,
and a 503 when the api has no tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from broker.messages import ChatMessage, GenerateJob
from ops.tokenizer import HFTokenizer, LazyTokenizer
from tests.api.conftest import MODEL, Served
from tests.api.test_errors import assert_error
from workers.engine.model.loader import LoadedModel
from workers.jobs.prompt import prompt_token_ids

MESSAGES = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "there"}]},
]


@pytest.fixture
def tok_api(serve: Callable[..., Served], rds: redis.Redis, api_tokenizer: HFTokenizer) -> Served:
    return serve(tokenizer=api_tokenizer)


def test_a_prompt_round_trips(tok_api: Served, smollm2: LoadedModel) -> None:
    prompt = "The quick brown fox, naïve café ünïcode 🙂."
    with tok_api.client() as c:
        r = c.post("/tokenize", json={"model": MODEL, "prompt": prompt})
        assert r.status_code == 200, r.text
        out = r.json()
        back = c.post("/detokenize", json={"model": MODEL, "tokens": out["tokens"]})
    worker_ids = prompt_token_ids(GenerateJob(MODEL, prompt=prompt), smollm2.tokenizer)
    assert out == {"count": len(worker_ids), "max_model_len": smollm2.max_model_len, "tokens": worker_ids}
    assert back.status_code == 200 and back.json() == {"prompt": prompt}


def test_add_special_tokens_is_passed_on(tok_api: Served, smollm2: LoadedModel) -> None:
    with tok_api.client() as c:
        r = c.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False})  # model optional
    assert r.status_code == 200
    assert r.json()["tokens"] == smollm2.tokenizer("hi", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_messages_are_the_workers_prompt(
    tok_api: Served, smollm2: LoadedModel, add_generation_prompt: bool
) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": add_generation_prompt}
    with tok_api.client() as c:
        r = c.post("/tokenize", json=body)
        assert r.status_code == 200, r.text
        tokens = r.json()["tokens"]
        text = c.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert text.startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello, there<|im_end|>"
    )
    assert text.endswith("<|im_start|>assistant\n") == add_generation_prompt
    if add_generation_prompt:  # what a chat completion runs
        job = GenerateJob(
            MODEL,
            endpoint="chat",
            messages=(ChatMessage("system", "Be brief."), ChatMessage("user", "Hello, there")),
        )
        assert tokens == prompt_token_ids(job, smollm2.tokenizer)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [
        ("/detokenize", {"tokens": [1, 49152]}, 400, "tokens", None),  # one past the vocabulary
        ("/detokenize", {"tokens": [-1]}, 400, "tokens", None),
        ("/detokenize", {"tokens": [1.0]}, 400, "tokens", None),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens", None),
        ("/tokenize", {"prompt": 5}, 400, "prompt", None),
        (
            "/tokenize",
            {"prompt": "x", "return_token_strs": True},
            400,
            "return_token_strs",
            "unsupported_parameter",
        ),
        (
            "/tokenize",
            {"messages": MESSAGES, "add_special_tokens": True},
            400,
            "add_special_tokens",
            "unsupported_parameter",
        ),
        (
            "/tokenize",
            {"messages": MESSAGES, "chat_template": "{{x}}"},
            400,
            "chat_template",
            "unsupported_parameter",
        ),
        ("/tokenize", {"messages": []}, 400, "messages", None),
        ("/tokenize", {"model": MODEL}, 400, "prompt", None),
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model", "model_not_found"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model", "model_not_found"),
        ("/tokenize", ["x"], 400, "body", None),
    ],
    ids=repr,
)
def test_bad_bodies(tok_api: Served, path: str, body: Any, status: int, param: str, code: str | None) -> None:
    with tok_api.client() as c:
        r = c.post(path, json=body)
    assert_error(r, status, param)
    assert r.json()["error"]["code"] == code


def test_without_a_tokenizer_they_are_503(api: Served) -> None:
    with api.client() as c:
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            error = assert_error(c.post(path, json=body), 503)
            assert error["type"] == "service_unavailable_error" and "tokenizer" in error["message"]


def test_a_tokenizer_that_cannot_load_is_503(
    serve: Callable[..., Served], rds: redis.Redis, tmp_path: Path
) -> None:
    api = serve(tokenizer=LazyTokenizer("no-such-model", tmp_path))
    with api.client() as c:
        error = assert_error(c.post("/tokenize", json={"prompt": "x"}), 503)
    assert "no-such-model" in error["message"]


def test_they_need_the_tenant_key(
    serve: Callable[..., Served], rds: redis.Redis, api_tokenizer: HFTokenizer
) -> None:
    api = serve(tokenizer=api_tokenizer, api_key="k-secret")
    with api.client() as c:
        assert_error(c.post("/tokenize", json={"prompt": "x"}), 401, code="invalid_api_key")
        assert_error(c.post("/detokenize", json={"tokens": [1]}), 401, code="invalid_api_key")
        ok = c.post("/tokenize", json={"prompt": "x"}, headers={"Authorization": "Bearer k-secret"})
    assert ok.status_code == 200
