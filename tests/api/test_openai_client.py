"""The official openai client, unchanged, against the api served by uvicorn."""

from __future__ import annotations

import openai
import pytest

from tests.api.conftest import MODEL, Served
from tests.api.fake_worker import FakeWorker


@pytest.fixture
def client(api: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key="anything", max_retries=0, timeout=30)


def test_chat(client: openai.OpenAI, worker: FakeWorker) -> None:
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "Hello, world"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 4


def test_chat_stream_with_usage(client: openai.OpenAI, worker: FakeWorker) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "Hello, world"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_completions_and_stream(client: openai.OpenAI, worker: FakeWorker) -> None:
    out = client.completions.create(model=MODEL, prompt="Once", max_tokens=3)
    assert out.choices[0].text == "Hello, world"
    streamed = "".join(
        ch.choices[0].text for ch in client.completions.create(model=MODEL, prompt="x", stream=True)
    )
    assert streamed == "Hello, world"


def test_session_id_through_extra_body(client: openai.OpenAI, worker: FakeWorker) -> None:
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body={"session_id": "s1"}
    )
    assert worker.seen[0].job.session_id == "s1"


def test_errors_raise_the_client_exceptions(client: openai.OpenAI, worker: FakeWorker) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "TOO_LONG"}], stream=True
        )
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "CRASH"}])
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "CRASH_LATER"}], stream=True
    )
    with pytest.raises(openai.APIError):
        list(stream)


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_an_unsupported_parameter_is_a_bad_request(client: openai.OpenAI, worker: FakeWorker) -> None:
    """The client sends what it is given; a field kvferry lacks is refused, never dropped."""
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], reasoning_effort="low"
        )
    assert raised.value.code == "unsupported_parameter" and raised.value.param == "reasoning_effort"
    assert not worker.seen
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], user="u", store=False, metadata={"k": "v"}
    )
    assert out.choices[0].message.content == "Hello, world"
