"""A bf16 worker end to end, in every run of the suite (which otherwise computes in fp32): the openai
client -> api -> queue -> a `kvferry worker --dtype bfloat16` on the tiny model, its own Redis and
api so no other test's fp32 worker takes the jobs. One request asks for n choices, logprobs, a JSON
schema and a presence penalty; a second echoes its prompt's logprobs (lm-eval's loglikelihood);
a third continues a session from the bf16 pool. Run the end-to-end files themselves in bf16 with
KVFERRY_TEST_DTYPE=bfloat16 (docs/operations.md)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import redis
from openai import OpenAI

from broker.worker_registry import live_workers
from ops.bench.grammar.schemas import SCHEMAS
from ops.redis.server import RedisServer
from tests.integration.conftest import MODEL, WorkerProcess, running_api

NAME, SCHEMA, _ = SCHEMAS[4]  # nested: an object, an integer range, an array of short strings


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("bf16-redis")) as server:
        yield server


@pytest.fixture(scope="module")
def bf16_api(
    own_redis: RedisServer, start_worker: Callable[..., WorkerProcess], tmp_path_factory: Any
) -> Iterator[str]:
    worker = start_worker(
        "wbf16", "--dtype", "bfloat16", "--kv-cache-dtype", "bfloat16", redis_url=own_redis.url
    )
    log: Path = tmp_path_factory.mktemp("bf16-api") / "api.log"
    try:
        yield from running_api(["--redis-url", own_redis.url, "--model", MODEL], dict(os.environ), log)
    finally:
        worker.stop()  # before its Redis (this module's) goes


def test_the_worker_computes_in_bf16(bf16_api: str, own_redis: RedisServer) -> None:
    (worker,) = live_workers(redis.Redis.from_url(own_redis.url))
    assert worker.engine is not None
    assert (worker.engine.dtype, worker.engine.kv_cache_dtype) == ("bfloat16", "bfloat16")


def test_n_choices_with_logprobs_under_a_schema_and_a_penalty(bf16_api: str) -> None:
    client = OpenAI(base_url=f"{bf16_api}/v1", api_key="unused", max_retries=0, timeout=120)
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": NAME, "schema": SCHEMA, "strict": True},
    }
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "a user, as JSON"}],
        n=2,
        max_tokens=300,
        temperature=1.0,
        seed=7,
        logprobs=True,
        top_logprobs=2,
        presence_penalty=0.5,
        response_format=response_format,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
        content = choice.logprobs.content if choice.logprobs else None
        assert content, "logprobs asked for"
        for entry in content:
            assert math.isfinite(entry.logprob) and entry.logprob <= 0.0
            assert len(entry.top_logprobs) == 2
            assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    assert reply.usage is not None
    assert reply.usage.completion_tokens == sum(
        len(c.logprobs.content or []) for c in reply.choices if c.logprobs
    )


def test_echo_gives_the_prompts_logprobs(bf16_api: str) -> None:
    prompt = list(range(300, 316))
    body = {"model": MODEL, "prompt": [prompt], "max_tokens": 0, "echo": True, "logprobs": 1}
    answer = httpx.post(f"{bf16_api}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    logprobs = answer.json()["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"][0] is None and len(logprobs["token_logprobs"]) == len(prompt)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs["token_logprobs"][1:])


def test_a_session_continues_from_the_bf16_pool(bf16_api: str) -> None:
    client = OpenAI(base_url=f"{bf16_api}/v1", api_key="unused", max_retries=0, timeout=120)
    turn: Any = {
        "model": MODEL,
        "max_tokens": 8,
        "temperature": 0,
        "extra_body": {"ignore_eos": True, "session_id": "bf16"},
    }
    messages: list[Any] = [{"role": "user", "content": "Tell me about lighthouses."}]
    first = client.chat.completions.create(messages=messages, **turn)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And?"},
    ]
    second = client.chat.completions.create(messages=messages, **turn)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens > 0, second.usage
    assert second.usage.completion_tokens == 8
