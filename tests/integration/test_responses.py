"""The Responses API through real parts (redis-server, 2 workers, the api) and the official
`openai` client: create / retrieve / delete / input_items / stream / background / cancel; a
previous_response_id chain token-exact with HF generate on the whole history, its third turn
moved to the other worker and served from the cache; store false keeps nothing; a Codex-shaped
request (whole history, store false, prompt_cache_key) is served from the cache on its next turn."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from openai import OpenAI

from broker.messages import SessionRecord
from broker.sessions import store as session_store
from ops.redis.server import RedisServer
from tests.integration.conftest import MODEL, WorkerProcess, running_api, wait_for
from tests.integration.jobs import wait_settled

Reference = Callable[[list[int], int], list[int]]
MOVE_AFTER = 2
BLOCK = 16
SYSTEM = "You answer in one short sentence, and you never repeat yourself. " * 3


@pytest.fixture(scope="module")
def responses_api(
    redis_server: RedisServer, files_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    log = tmp_path_factory.mktemp("api-responses") / "api.log"
    env = {
        **os.environ,
        "KVFERRY_FILES_DIR": str(files_dir),
        "KVFERRY_SESSION_MOVE_AFTER_TURNS": str(MOVE_AFTER),
    }
    yield from running_api(["--redis-url", redis_server.url, "--model", MODEL], env, log)


# Two tenants of their own: test_tenant_sessions counts every byte its tenants pin, and shares this
# Redis within one pytest process.
ALICE, BOB = "key-resp-alice", "key-resp-bob"


@pytest.fixture(scope="module")
def tenant_api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("api-responses-tenants") / "api.log"
    env = {**os.environ, "KVFERRY_API_KEYS": f"{ALICE}:resp-alice,{BOB}:resp-bob"}
    yield from running_api(["--redis-url", redis_server.url, "--model", MODEL], env, log)


@pytest.fixture
def client(responses_api: str, two_workers: tuple[WorkerProcess, WorkerProcess]) -> OpenAI:
    return OpenAI(base_url=f"{responses_api}/v1", api_key="unused", max_retries=0, timeout=120)


def _template(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(t) for t in ids]


def test_create_retrieve_items_delete_and_store_false(client: OpenAI, responses_api: str) -> None:
    r = client.responses.create(
        model=MODEL,
        input="Say hello.",
        instructions=SYSTEM,
        max_output_tokens=6,
        temperature=0,
        metadata={"k": "v"},
    )
    assert r.id.startswith("resp_") and r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.output_text == r.output[0].content[0].text
    assert r.usage is not None and r.usage.output_tokens == 6 and r.usage.input_tokens > 0
    assert r.usage.input_tokens_details.cached_tokens >= 0 and r.metadata == {"k": "v"}
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    for crafted in (f"{r.id}:final", f"{r.id}:record"):  # ids that once spelled its end marker's key
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(crafted)
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(crafted)
    items = client.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "Say hello."

    # cursor pagination over several input items
    many = [{"role": "user", "content": f"part {i}"} for i in range(5)]
    r2 = client.responses.create(model=MODEL, input=many, max_output_tokens=2, temperature=0)  # type: ignore[arg-type]
    first = client.responses.input_items.list(r2.id, limit=2, order="asc")
    assert [i.content[0].text for i in first.data] == ["part 0", "part 1"] and first.has_more
    rest = client.responses.input_items.list(r2.id, limit=10, order="asc", after=first.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["part 2", "part 3", "part 4"] and not rest.has_more

    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)

    unstored = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL, input="hi", previous_response_id=unstored.id)
    assert bad.value.body["param"] == "previous_response_id"  # type: ignore[index]
    for field, value in (("reasoning", {"effort": "low"}), ("truncation", "auto"), ("service_tier", "flex")):
        reply = httpx.post(f"{responses_api}/v1/responses", json={"model": MODEL, "input": "x", field: value})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == field, reply.text


def test_another_tenants_ids_name_nothing(
    tenant_api: str,
    two_workers: tuple[WorkerProcess, ...],
) -> None:
    alice, bob = (
        OpenAI(base_url=f"{tenant_api}/v1", api_key=key, max_retries=0, timeout=120) for key in (ALICE, BOB)
    )
    r = alice.responses.create(model=MODEL, input="mine", max_output_tokens=2, background=True)
    for call in (
        lambda: bob.responses.retrieve(r.id),
        lambda: bob.responses.input_items.list(r.id),
        lambda: bob.responses.cancel(r.id),
        lambda: bob.responses.delete(r.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    wait_for(
        lambda: alice.responses.retrieve(r.id).status in ("completed", "incomplete"), 60, "alice's response"
    )
    with pytest.raises(openai.BadRequestError):
        bob.responses.create(model=MODEL, input="yours?", previous_response_id=r.id)
    conversation = httpx.post(
        f"{tenant_api}/v1/conversations", json={}, headers={"Authorization": f"Bearer {ALICE}"}
    )
    cid = conversation.json()["id"]
    as_bob = {"Authorization": f"Bearer {BOB}"}
    assert httpx.get(f"{tenant_api}/v1/conversations/{cid}", headers=as_bob).status_code == 404
    assert httpx.get(f"{tenant_api}/v1/conversations/{cid}/items", headers=as_bob).status_code == 404
    alice.responses.delete(r.id)


def test_previous_response_chain_is_token_exact_and_cached_on_the_moved_turn(
    client: OpenAI,
    two_workers: tuple[WorkerProcess, WorkerProcess],
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    tag = uuid.uuid4().hex[:8]
    instructions = f"Chain {tag}. {SYSTEM}"
    history: list[dict[str, str]] = [{"role": "system", "content": instructions}]
    previous, session, workers, held = None, None, [], 0
    for turn in range(1, 5):
        question = f"question number {turn} of {tag}"
        r = client.responses.create(
            model=MODEL,
            input=question,
            instructions=instructions,
            previous_response_id=previous,
            max_output_tokens=8,
            temperature=0,
        )
        session = session or r.id  # the chain's kvferry session is its first response's id
        record = session_store.load(redis_client, "", session)
        assert isinstance(record, SessionRecord)
        history.append({"role": "user", "content": question})
        assert r.usage is not None
        n_in, n_out = r.usage.input_tokens, r.usage.output_tokens
        prompt = list(record.token_ids[:n_in])
        # the prompt is the whole history (its earlier replies as generated), the answer HF's on it
        assert tokenizer.decode(prompt) == tokenizer.decode(_template(tokenizer, history)), turn
        assert list(record.token_ids[n_in:]) == tiny_reference(prompt, n_out), turn
        if turn > 1:
            cached = r.usage.input_tokens_details.cached_tokens
            assert cached >= (held - 1) // BLOCK * BLOCK, (turn, cached, held)
        held = len(record.token_ids)
        workers.append(r.model_extra["worker"] if r.model_extra else None)
        # the reply as generated: a special token the model emitted is in the next prompt, not in output_text
        reply = tokenizer.decode(record.token_ids[n_in:], skip_special_tokens=False)
        history.append({"role": "assistant", "content": reply.removesuffix(tokenizer.eos_token)})
        previous = r.id
        wait_settled(redis_client, "", session)  # a client reads the answer: its blocks reach Redis
    assert workers[0] == workers[1] and workers[2] != workers[1], workers  # turn 3: the forced move


def test_stream_events_in_order_each_delta_once(client: OpenAI) -> None:
    kinds, seqs, deltas = [], [], []
    with client.responses.stream(
        model=MODEL, input="Tell me a story.", max_output_tokens=12, temperature=0
    ) as s:
        for event in s:
            kinds.append(event.type)
            seqs.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = event.response  # response.completed, or (cut by max_output_tokens) .incomplete
    assert seqs == list(range(len(seqs)))
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if final.status == "incomplete" else "response.completed",
    ]
    assert "".join(deltas) == final.output_text and final.usage is not None
    assert client.responses.retrieve(final.id).output_text == final.output_text


def _events(url: str, response_id: str, after: int) -> list[dict[str, Any]]:
    out = []
    with httpx.stream(
        "GET",
        f"{url}/v1/responses/{response_id}",
        params={"stream": "true", "starting_after": after},
        timeout=120,
    ) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def test_background_polls_resumes_and_cancels(client: OpenAI, responses_api: str) -> None:
    r = client.responses.create(
        model=MODEL, input="Go on.", max_output_tokens=10, temperature=0, background=True
    )
    assert r.status in ("queued", "in_progress") and r.background
    wait_for(
        lambda: client.responses.retrieve(r.id).status in ("completed", "incomplete"), 60, "the response"
    )
    done = client.responses.retrieve(r.id)
    whole = _events(responses_api, r.id, -1)
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert whole[0]["type"] == "response.created" and whole[0]["response"]["status"] == "queued"
    assert [o["id"] for o in whole[-1]["response"]["output"]] == [o.id for o in done.output]
    resumed = _events(responses_api, r.id, 3)
    assert resumed == whole[4:]
    text = "".join(e["delta"] for e in whole if e["type"] == "response.output_text.delta")
    assert text == done.output_text

    slow = client.responses.create(model=MODEL, input="Go on and on.", max_output_tokens=900, background=True)
    cancelled = client.responses.cancel(slow.id)
    assert cancelled.status == "cancelled"
    time.sleep(1)
    assert client.responses.retrieve(slow.id).status == "cancelled"


def test_codex_shaped_turns_are_served_from_the_cache(client: OpenAI) -> None:
    key = f"codex-{uuid.uuid4().hex}"
    history: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": SYSTEM * 2}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
    ]

    def turn() -> Any:
        with client.responses.stream(
            model=MODEL, input=history, store=False, prompt_cache_key=key, max_output_tokens=6, temperature=0
        ) as s:
            events = list(s)
            return events[-1].response

    first = turn()
    history.append(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": first.output_text}],
        }
    )
    history.append(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]}
    )
    second = turn()
    assert second.usage is not None and first.usage is not None
    assert (
        second.usage.input_tokens_details.cached_tokens
        >= (first.usage.total_tokens - 1) // BLOCK * BLOCK - BLOCK
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


def test_a_conversation_gathers_its_responses_items_and_continues_its_session(
    client: OpenAI, responses_api: str
) -> None:
    made = httpx.post(
        f"{responses_api}/v1/conversations",
        json={
            "items": [{"type": "message", "role": "developer", "content": SYSTEM * 2}],
            "metadata": {"a": "b"},
        },
    ).json()
    cid = made["id"]
    assert cid.startswith("conv_") and made["metadata"] == {"a": "b"}
    assert httpx.get(f"{responses_api}/v1/conversations/{cid}").json() == made
    first = client.responses.create(
        model=MODEL, input="one", conversation=cid, max_output_tokens=4, temperature=0
    )
    second = client.responses.create(
        model=MODEL, input="two", conversation=cid, max_output_tokens=4, temperature=0
    )
    assert first.usage is not None and second.usage is not None
    assert (
        second.usage.input_tokens_details.cached_tokens
        >= (first.usage.total_tokens - 1) // BLOCK * BLOCK - BLOCK
    )
    items = httpx.get(f"{responses_api}/v1/conversations/{cid}/items", params={"order": "asc"}).json()["data"]
    texts = [i["content"][0]["text"] for i in items]
    assert texts == [SYSTEM * 2, "one", first.output_text, "two", second.output_text]
    assert len({i["id"] for i in items}) == len(items)
    added = httpx.post(
        f"{responses_api}/v1/conversations/{cid}/items",
        json={"items": [{"role": "user", "content": "three"}]},
    ).json()
    assert added["data"][0]["content"][0]["text"] == "three"
    assert httpx.delete(f"{responses_api}/v1/conversations/{cid}").json()["deleted"] is True
    assert httpx.get(f"{responses_api}/v1/conversations/{cid}").status_code == 404
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="x", conversation=cid)


def test_logprobs_and_a_function_call_loop_through_the_client(client: OpenAI) -> None:
    r = client.responses.create(
        model=MODEL,
        input="count",
        max_output_tokens=5,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    part = r.output[0].content[0]  # type: ignore[union-attr]
    assert part.logprobs is not None and len(part.logprobs) == 5
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    assert "".join(lp.token for lp in part.logprobs) == part.text

    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
    call = client.responses.create(
        model=MODEL,
        input="weather in Paris?",
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=100,
    )
    calls = [o for o in call.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and call.status == "completed", call.output
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=call.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
        tools=[tool],  # type: ignore[list-item]
        max_output_tokens=4,
        temperature=0,
    )
    assert answer.status in ("completed", "incomplete") and answer.usage is not None
    assert answer.usage.input_tokens > call.usage.input_tokens  # type: ignore[union-attr]
