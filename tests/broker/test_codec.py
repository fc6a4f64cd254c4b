"""The codec's guarantees: every message survives the wire unchanged; anything else is refused
with a typed error (CodecError, or the message's own InvalidRequestError) and never guessed at."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker import codec
from broker.codec import CodecError
from broker.errors import InvalidRequestError, KvferryError
from broker.messages import (
    ChatMessage,
    EngineFigures,
    GenerateJob,
    GenerateResult,
    JobDone,
    JobFailed,
    SessionRecord,
    TokenDelta,
    Usage,
    WorkerStatus,
)
from broker.sampling import SamplingParams

USAGE = Usage(7, 3, 4, pool_tokens=2, warm_tokens=1, redis_tokens=1, recomputed_tokens=5)
RESULT = GenerateResult("j1", "m", "héllo", (1, 2, 3), "stop", USAGE, "w@h", 0.5, 0.25, 1.5)
FIGURES = EngineFigures(1, 2, 3, 4, 5, 10, 6, 2, 4096, 100, 60, 0.125, 1 << 20, 1 << 24)
JOB = GenerateJob(
    "m",
    endpoint="chat",
    messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hi")),
    params=SamplingParams(max_tokens=8, temperature=0.7, top_k=5, top_p=0.9, seed=2**64 - 1, stop=("\n",)),
    session_id="s1",
    tenant="t",
    submitted_at=1712345678.25,
    pin_prefix=True,
    cache_salt="salt",
)
MESSAGES: list[Any] = [
    JOB,
    GenerateJob("m", prompt_token_ids=(5, 6, 7)),
    RESULT,
    USAGE,
    TokenDelta("x", (9,), start=3, text_start=2, epoch=2),
    JobDone(RESULT, epoch=1),
    JobFailed("invalid_request_error", "too long", 400, "messages", epoch=3),
    FIGURES,
    WorkerStatus("w", "kvferry.worker.w", "m", 1, 2, 3, 1.5, FIGURES, healthy=False),
    WorkerStatus("w", "kvferry.worker.w", "m", 0, 0, 0, 1.5),
    SessionRecord("s1", "t", "m", (1, 2), ("ab", "cd"), "w", 1712345678.5, 2),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: Any) -> None:
    cls = type(message)
    assert codec.decode(codec.encode(message), cls) == message
    # as Celery carries them: builtins, through JSON text
    assert codec.from_wire(cls, json.loads(json.dumps(codec.to_wire(message)))) == message


def test_jobs_results_and_events_round_trip_through_their_own_functions() -> None:
    assert codec.decode_job(json.loads(json.dumps(codec.encode_job(JOB)))) == JOB
    assert codec.decode_result(json.loads(json.dumps(codec.encode_result(RESULT)))) == RESULT
    for event in MESSAGES[4:7]:
        assert codec.decode_event(codec.encode_event(event)) == event


def test_the_event_union_dispatches_on_its_tag() -> None:
    delta = codec.decode_event(b'{"event":"delta","text":"a","token_ids":[1]}')
    assert isinstance(delta, TokenDelta) and delta.token_ids == (1,)
    failed = codec.decode_event('{"event":"failed","error_type":"e","message":"m","status_code":500}')
    assert isinstance(failed, JobFailed) and failed.param is None
    done = codec.decode_event(codec.encode_event(JobDone(RESULT)))
    assert isinstance(done, JobDone) and done.result == RESULT
    assert json.loads(codec.encode_event(TokenDelta("a", ())))["event"] == "delta"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"event":"progress","text":"a","token_ids":[1]}',  # unknown type
        b'{"text":"a","token_ids":[1]}',  # no type
        b'{"event":"delta","data":{"text":"a","token_ids":[1]}}',  # fields of another shape
        b'{"event":"done","text":"a","token_ids":[1]}',  # a delta's fields under "done"
        b"[1, 2]",
        b"not json",
        b"\xff\xfe",
    ],
)
def test_events_that_are_not_ours_raise(raw: bytes) -> None:
    with pytest.raises(CodecError):
        codec.decode_event(raw)


def test_only_stream_events_encode_as_events() -> None:
    with pytest.raises(CodecError):
        codec.encode_event(USAGE)  # type: ignore[arg-type]


def _job_wire(**changes: Any) -> dict[str, Any]:
    wire: dict[str, Any] = json.loads(json.dumps(codec.encode_job(JOB)))
    wire.update(changes)
    return wire


@pytest.mark.parametrize(
    "wire",
    [
        _job_wire(deadline=3),  # unknown top-level field
        _job_wire(params={**_job_wire()["params"], "beam_width": 4}),  # unknown nested field
        _job_wire(messages=[{"role": "user", "content": "x", "name": "bob"}]),  # unknown, in a list
        _job_wire(logprobs=True),  # an OpenAI field a worker does not implement
        _job_wire(params={**_job_wire()["params"], "best_of": 2}),  # the api's, not a job's
    ],
    ids=["top", "params", "message", "openai top", "openai params"],
)
def test_unknown_fields_raise(wire: dict[str, Any]) -> None:
    with pytest.raises(CodecError):
        codec.decode_job(wire)


@pytest.mark.parametrize(
    "wire",
    [
        _job_wire(model=7),
        _job_wire(endpoint="embeddings"),  # not one of the Literal's values
        _job_wire(prompt_token_ids=[1, "2"]),
        _job_wire(prompt_token_ids=[1, 2.0]),
        _job_wire(pin_prefix=1),  # an int is no bool
        _job_wire(submitted_at="now"),
        _job_wire(params={"max_tokens": True}),  # a bool is no int
        _job_wire(messages="hi"),
        _job_wire(params=[]),
    ],
    ids=repr,
)
def test_wrong_types_raise(wire: dict[str, Any]) -> None:
    with pytest.raises(CodecError):
        codec.decode_job(wire)


def test_missing_required_fields_raise() -> None:
    wire = json.loads(json.dumps(codec.encode_result(RESULT)))
    del wire["usage"]
    with pytest.raises(CodecError, match="usage"):
        codec.decode_result(wire)
    with pytest.raises(CodecError):
        codec.decode_job({})  # no model
    with pytest.raises(CodecError):
        codec.decode_result("not an object")


def test_a_message_from_an_older_producer_decodes_with_the_defaults() -> None:
    """Fields added since (cache_salt, pin_prefix, usage's tier split, epoch, healthy) are absent
    from what an older version sends; each takes its default."""
    job = codec.decode_job({"model": "m", "prompt": "hi"})
    assert job == GenerateJob("m", prompt="hi") and job.cache_salt == "" and not job.pin_prefix
    assert job.params == SamplingParams()
    usage = codec.from_wire(Usage, {"prompt_tokens": 5, "completion_tokens": 2, "cached_tokens": 1})
    assert (usage.pool_tokens, usage.redis_tokens, usage.recomputed_tokens) == (0, 0, 0)
    delta = codec.decode_event(b'{"event":"delta","text":"a","token_ids":[1]}')
    assert (delta.start, delta.epoch) == (-1, 0)  # type: ignore[union-attr]
    old_status = json.loads(codec.encode(WorkerStatus("w", "q", "m", 0, 0, 0, 1.0)))
    del old_status["healthy"], old_status["engine"]
    assert codec.decode(json.dumps(old_status), WorkerStatus).healthy


def test_ints_are_accepted_as_floats_and_kept_exact() -> None:
    job = codec.decode_job(_job_wire(submitted_at=17, params={"temperature": 1, "seed": 2**64 - 1}))
    assert job.submitted_at == 17.0 and isinstance(job.submitted_at, float)
    assert job.params.temperature == 1.0 and job.params.seed == 2**64 - 1


@pytest.mark.parametrize(("field", "value"), [("seed", 2**64), ("temperature", 1e-300), ("top_p", 0.0)])
def test_a_value_out_of_range_raises_the_messages_own_error(field: str, value: Any) -> None:
    """It decodes, but SamplingParams refuses it: the worker answers 400 naming the field."""
    with pytest.raises(InvalidRequestError) as info:
        codec.decode_job(_job_wire(params={field: value}))
    assert info.value.param == field and not isinstance(info.value, CodecError)


def test_codec_errors_are_kvferry_errors_and_say_where() -> None:
    with pytest.raises(CodecError) as info:
        codec.decode_job(_job_wire(messages=[{"role": "user", "content": 3}]))
    assert isinstance(info.value, KvferryError) and isinstance(info.value, ValueError)
    assert "messages" in str(info.value) and "content" in str(info.value)


def test_what_is_no_message_does_not_encode() -> None:
    with pytest.raises(CodecError):
        codec.encode(object())
    with pytest.raises(CodecError):
        codec.to_wire({"x": object()})


def test_messages_are_frozen() -> None:
    with pytest.raises(AttributeError):
        JOB.model = "other"  # type: ignore[misc]
