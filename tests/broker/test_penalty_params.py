"""The penalty, bias, min_p, min_tokens and stop_token_ids fields of SamplingParams: each bad value
is refused naming its field, whether constructed, decoded from JSON or taken from a Celery
producer's send_task; an older producer's params, without them, decode with every one off."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest

from broker import codec
from broker.codec import CodecError
from broker.errors import InvalidRequestError
from broker.messages import GenerateJob
from broker.penalty_params import MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS
from broker.sampling import SamplingParams

FULL = SamplingParams(
    max_tokens=20,
    frequency_penalty=-2.0,
    presence_penalty=2.0,
    repetition_penalty=10.0,
    logit_bias=((0, -100.0), (49151, 100.0), (7, 0.5)),
    min_p=1.0,
    min_tokens=20,
    stop_token_ids=(0, 5, 2**40),
)

BAD: list[tuple[dict[str, Any], str]] = [
    ({"frequency_penalty": 2.01}, "frequency_penalty"),
    ({"frequency_penalty": math.nan}, "frequency_penalty"),
    ({"frequency_penalty": "1"}, "frequency_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"presence_penalty": math.inf}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"repetition_penalty": 10.5}, "repetition_penalty"),
    ({"repetition_penalty": True}, "repetition_penalty"),
    ({"min_p": -0.1}, "min_p"),
    ({"min_p": 1.01}, "min_p"),
    ({"min_p": math.nan}, "min_p"),
    ({"logit_bias": ((5, 100.5),)}, "logit_bias"),
    ({"logit_bias": ((5, math.inf),)}, "logit_bias"),
    ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
    ({"logit_bias": ((True, 1.0),)}, "logit_bias"),
    ({"logit_bias": ((5, 1.0), (5, 2.0))}, "logit_bias"),
    ({"logit_bias": ((5,),)}, "logit_bias"),
    ({"logit_bias": tuple((i, 1.0) for i in range(MAX_LOGIT_BIAS + 1))}, "logit_bias"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 1.0}, "min_tokens"),
    ({"min_tokens": 17}, "min_tokens"),  # over max_tokens (16)
    ({"stop_token_ids": (-1,)}, "stop_token_ids"),
    ({"stop_token_ids": (1, False)}, "stop_token_ids"),
    ({"stop_token_ids": tuple(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids"),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=lambda v: repr(v)[:60] if isinstance(v, dict) else v)
def test_refused_values_name_their_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**fields)
    assert info.value.param == param


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("frequency_penalty", 3),
        ("presence_penalty", math.nan),
        ("repetition_penalty", 0),
        ("min_p", 1.5),
        ("logit_bias", [[5, 101]]),
        ("logit_bias", [[5, 1.0], [5, 2.0]]),
        ("logit_bias", [[-1, 1.0]]),
        ("logit_bias", [[i, 1.0] for i in range(MAX_LOGIT_BIAS + 1)]),
        ("min_tokens", 17),
        ("min_tokens", -1),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", list(range(MAX_STOP_TOKEN_IDS + 1))),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_a_send_task_job_with_a_bad_value_is_refused_naming_the_field(field: str, value: Any) -> None:
    """Well typed, out of range: it decodes, SamplingParams refuses it, the worker answers 400."""
    wire = json.loads(json.dumps({"model": "m", "prompt": "hi", "params": {field: value}}))  # as Celery
    with pytest.raises(InvalidRequestError) as info:
        codec.decode_job(wire)
    assert info.value.param == field and not isinstance(info.value, CodecError)


@pytest.mark.parametrize(
    "params",
    [
        {"logit_bias": {"5": 1.0}},  # OpenAI's map shape: the message carries pairs
        {"logit_bias": [[5, 1.0, 2.0]]},
        {"logit_bias": [["5", 1.0]]},
        {"stop_token_ids": ["5"]},
        {"min_tokens": True},
        {"repetition_penalty": "1.2"},
    ],
    ids=repr,
)
def test_a_send_task_job_of_the_wrong_shape_is_a_codec_error(params: dict[str, Any]) -> None:
    with pytest.raises((CodecError, InvalidRequestError)):
        codec.decode_job({"model": "m", "prompt": "hi", "params": params})


def test_every_field_survives_the_wire() -> None:
    job = GenerateJob("m", prompt="hi", params=FULL)
    assert codec.decode(codec.encode(job), GenerateJob) == job
    assert codec.decode_job(json.loads(json.dumps(codec.encode_job(job)))) == job
    assert msgspec.json.decode(msgspec.json.encode(FULL), type=SamplingParams) == FULL


def test_an_older_producers_params_decode_with_every_field_off() -> None:
    old = {"max_tokens": 8, "temperature": 0.5, "top_k": 3, "top_p": 0.9, "seed": 1, "stop": ["x"]}
    params = codec.decode_job({"model": "m", "prompt": "hi", "params": old}).params
    assert (params.frequency_penalty, params.presence_penalty, params.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (params.logit_bias, params.min_p, params.min_tokens, params.stop_token_ids) == ((), 0.0, 0, ())


def test_min_tokens_may_equal_max_tokens_or_go_with_none() -> None:
    SamplingParams(max_tokens=5, min_tokens=5).check()
    SamplingParams(max_tokens=None, min_tokens=10**6).check()


def test_check_catches_an_instance_that_skipped_its_constructor() -> None:
    params = SamplingParams()
    msgspec.structs.force_setattr(params, "min_p", 2.0)
    with pytest.raises(InvalidRequestError) as info:
        params.check()
    assert info.value.param == "min_p"
