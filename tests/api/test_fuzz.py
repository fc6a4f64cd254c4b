"""Schemathesis against the real app's OpenAPI schema (served by uvicorn, the fake worker on real
Redis, the real tokenizer): 1,000 generated requests (derandomized: the same ones each run), valid
and invalid, in bounded time; no answer is a 5xx, and the server still serves a normal request
afterwards."""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from ops.tokenizer import HFTokenizer
from tests.api.conftest import MODEL, Served
from tests.api.fake_worker import FakeWorker

CASES = 1000
BUDGET_S = 180.0  # room for a loaded machine (a soak run beside it): bounded, not timed
POSTS = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/jobs", "/tokenize", "/detokenize"}


def for_generation(doc: dict[str, Any]) -> dict[str, Any]:
    """The app's document, narrowed so that generation spends its time on what matters: valid
    bodies name the served model (another is a 404, tested elsewhere) and hold only documented
    fields (the app refuses others; making up arbitrary extra JSON is most of hypothesis's time).
    Invalid bodies still break these rules, and every other one."""
    doc = copy.deepcopy(doc)
    for model in doc["components"]["schemas"].values():
        if model.get("type") == "object":
            model["additionalProperties"] = False
        if "model" in model.get("properties", {}):
            model["properties"]["model"] = {"enum": [MODEL]}
    return doc


def test_fuzz_no_5xx(
    serve: Callable[..., Served], rds: redis.Redis, worker: FakeWorker, api_tokenizer: HFTokenizer
) -> None:
    api = serve(job_timeout_s=10.0, tokenizer=api_tokenizer)  # /tokenize runs, never a 503
    doc = requests.get(f"{api.url}/openapi.json", timeout=10).json()
    assert doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    schema = schemathesis.openapi.from_dict(for_generation(doc))
    strategies = []
    for op in (r.ok() for r in schema.get_all_operations()):  # type: ignore[union-attr]
        if op.path in POSTS:  # the bodies are where the bugs were: valid and invalid ones
            strategies += [op.as_strategy(m) for m in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)] * 3
        else:  # path parameters: no invalid ones to make
            strategies.append(op.as_strategy(GenerationMode.POSITIVE))
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    session = requests.Session()

    @settings(
        max_examples=CASES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(strategies))
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=api.url, session=session, timeout=30)
        statuses[response.status_code] += 1
        if (case.path, response.status_code) == ("/health", 503):
            return  # the readiness probe's answer: the fake worker sends no heartbeat
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path} {case.body!r:.300} -> {response.text:.300}")

    started = time.monotonic()
    run()
    elapsed = time.monotonic() - started
    total = sum(statuses.values())
    print(f"fuzz: {total} cases in {elapsed:.1f}s, statuses {dict(sorted(statuses.items()))}")
    assert not failures, failures[:5]
    assert total >= CASES, statuses
    assert elapsed < BUDGET_S
    assert statuses[200] > 0 and statuses[400] > 0  # both kinds of bodies were generated

    r = session.post(
        f"{api.url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "after"}], "max_tokens": 3},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello, world"
