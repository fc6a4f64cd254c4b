"""SamplingParams validates every field at construction, naming the field it refuses."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from broker.errors import InvalidRequestError
from broker.sampling import MIN_TEMPERATURE, SEED_MAX, SamplingParams


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"temperature": 1e-300}, "temperature"),
        ({"temperature": MIN_TEMPERATURE / 2}, "temperature"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_p": math.inf}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"stop": ("",)}, "stop"),
        ({"stop": ("a", "b", "c", "d", "e")}, "stop"),
        ({"ignore_eos": "false"}, "ignore_eos"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else str(v),
)
def test_refused_values_name_their_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**fields)
    assert info.value.param == param


@pytest.mark.parametrize(
    "fields",
    [
        {"seed": 0},
        {"seed": SEED_MAX},
        {"temperature": 0},
        {"temperature": MIN_TEMPERATURE},
        {"temperature": 100.0},
        {"top_k": -1},
        {"top_p": 1e-9},
        {"max_tokens": None},
    ],
    ids=repr,
)
def test_edge_values_are_accepted(fields: dict[str, Any]) -> None:
    SamplingParams(**fields).check()


def test_check_catches_an_instance_that_skipped_its_constructor() -> None:
    params = SamplingParams()
    msgspec.structs.force_setattr(params, "seed", 2**64)
    with pytest.raises(InvalidRequestError) as info:
        params.check()
    assert info.value.param == "seed"
