"""Structured outputs through real parts: the openai client -> api -> queue -> a `kvferry worker`
whose task thread compiles the schema; and a bad regex sent straight to Celery (past the api's
check) fails its job with a 400 naming the field, the worker serving on."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import jsonschema
import redis
from openai import OpenAI

from broker import keys
from broker.codec import encode_job
from broker.jobs import events as job_events
from broker.messages import GenerateJob, JobFailed
from broker.sampling import SamplingParams
from broker.structured import StructuredOutputs
from ops.bench.grammar.schemas import SCHEMAS
from tests.integration.conftest import MODEL, WorkerProcess

NAME, SCHEMA, _ = SCHEMAS[4]  # nested: an object, an integer range, an array of short strings


def test_json_schema_through_a_real_worker(
    api_url: str, worker_factory: Callable[..., WorkerProcess], celery_app: Any, redis_client: redis.Redis
) -> None:
    worker = worker_factory("grammar")
    client = OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": NAME, "schema": SCHEMA, "strict": True},
    }
    messages: Any = [{"role": "user", "content": "a user, as JSON"}]

    reply = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=300, temperature=1.0, response_format=response_format
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), SCHEMA)

    chunks = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=300,
        temperature=1.0,
        response_format=response_format,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)

    choice = client.completions.create(
        model=MODEL, prompt="yes or no?", max_tokens=20, extra_body={"guided_choice": ["yes", "no"]}
    )
    assert choice.choices[0].text in ("yes", "no")

    bad = GenerateJob(
        MODEL,
        prompt_token_ids=(5, 6, 7),
        params=SamplingParams(structured_outputs=StructuredOutputs(regex="a{3", source="guided_regex")),
        submitted_at=time.time(),
    )
    handle = celery_app.send_task(
        keys.GENERATE_TASK, args=[encode_job(bad)], task_id=str(uuid.uuid4()), queue=worker.queue
    )
    events = list(job_events.follow(redis_client, handle.id, timeout_s=60))
    assert isinstance(events[-1], JobFailed), events
    assert events[-1].status_code == 400 and events[-1].param == "guided_regex", events[-1]
    assert worker.process.poll() is None
