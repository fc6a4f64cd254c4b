"""The penalty, bias, min_p, min_tokens and stop_token_ids fields at the edge: bounded (a 400
naming the field, nothing written to Redis), and carried to the worker as SamplingParams."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from api.schema.openai import parse_request
from broker.errors import InvalidRequestError
from tests.api.conftest import MODEL, Served, request_keys
from tests.api.fake_worker import FakeWorker
from tests.api.test_errors import assert_error

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("frequency_penalty 2.5", chat(frequency_penalty=2.5), "frequency_penalty"),
    ("presence_penalty -3", chat(presence_penalty=-3), "presence_penalty"),
    ("presence_penalty as a string", chat(presence_penalty="1"), "presence_penalty"),
    ("repetition_penalty 0", chat(repetition_penalty=0), "repetition_penalty"),
    ("repetition_penalty 11", chat(repetition_penalty=11), "repetition_penalty"),
    ("min_p 1.5", chat(min_p=1.5), "min_p"),
    ("min_p -0.1", chat(min_p=-0.1), "min_p"),
    ("min_tokens -1", chat(min_tokens=-1), "min_tokens"),
    ("min_tokens 2.0", chat(min_tokens=2.0), "min_tokens"),
    ("min_tokens over max_tokens", chat(min_tokens=9, max_tokens=8), "min_tokens"),
    ("logit_bias 101", chat(logit_bias={"5": 101}), "logit_bias"),
    ("logit_bias a word", chat(logit_bias={"five": 1}), "logit_bias"),
    ("logit_bias -1", chat(logit_bias={"-1": 1}), "logit_bias"),
    ("logit_bias 007", chat(logit_bias={"007": 1}), "logit_bias"),
    ("logit_bias 2**31", chat(logit_bias={str(2**31): 1}), "logit_bias"),
    ("logit_bias a string value", chat(logit_bias={"5": "1"}), "logit_bias"),
    ("logit_bias a list", chat(logit_bias=[[5, 1]]), "logit_bias"),
    ("logit_bias 301 entries", chat(logit_bias={str(i): 1 for i in range(301)}), "logit_bias"),
    ("stop_token_ids -1", chat(stop_token_ids=[-1]), "stop_token_ids"),
    ("stop_token_ids a string", chat(stop_token_ids=["5"]), "stop_token_ids"),
    ("stop_token_ids 65", chat(stop_token_ids=list(range(65))), "stop_token_ids"),
]


@pytest.mark.parametrize(("body", "param"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_values_name_their_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_request(CHAT, body)
    assert info.value.param == param


def test_fields_map_onto_sampling_params() -> None:
    body = chat(
        frequency_penalty=1,
        presence_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={"50256": -100, "0": 2.5},
        min_p=0.05,
        min_tokens=3,
        stop_token_ids=[2, 7],
        max_tokens=10,
    )
    p = parse_request(CHAT, body).params
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (1.0, -0.5, 1.2)
    assert p.logit_bias == ((50256, -100.0), (0, 2.5))
    assert (p.min_p, p.min_tokens, p.stop_token_ids) == (0.05, 3, (2, 7))
    off = parse_request(TEXT, {"model": MODEL, "prompt": "x"}).params
    assert (off.frequency_penalty, off.presence_penalty, off.repetition_penalty, off.min_p) == (0, 0, 1, 0)
    assert (off.logit_bias, off.min_tokens, off.stop_token_ids) == ((), 0, ())


def test_over_http_a_bad_value_is_a_400_and_a_good_one_reaches_the_worker(
    api: Served, rds: redis.Redis, worker: FakeWorker
) -> None:
    with api.client() as c:
        assert_error(c.post(CHAT, json=chat(logit_bias={"5": 200})), 400, "logit_bias")
        assert_error(c.post("/v1/jobs", json={"endpoint": CHAT, "body": chat(min_p=2)}), 400)
        assert request_keys(rds) == []
        edges = chat(
            frequency_penalty=-2,
            presence_penalty=2,
            repetition_penalty=10,
            logit_bias={"0": -100, "2147483647": 100},
            min_p=1,
            min_tokens=4,
            max_tokens=4,
            stop_token_ids=[0, 2**31 - 1],
        )
        r = c.post(CHAT, json=edges)
        assert r.status_code == 200, r.text
    params = worker.seen[-1].job.params
    assert params.logit_bias == ((0, -100.0), (2**31 - 1, 100.0)) and params.min_tokens == 4
    assert params.stop_token_ids == (0, 2**31 - 1) and params.repetition_penalty == 10
