"""Tool calling through the engine: tool_choice required (or a named function) is enforced by its
grammar, so a random model sampled at temperature 1 always writes calls that parse and whose
arguments follow the tool's parameters; tools and tool turns render with the chat template, in
the Hermes text for a template that lacks tools (SmolLM2) and natively for one that has them."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from api.schema.openai import CompletionRequest, parse_request
from api.tool_calls.parser import parse
from api.tool_calls.registry import parser_for
from broker.messages import ChatMessage, GenerateJob, ToolCall, ToolSpec
from broker.sessions.tokens import after_turn
from tests.workers._helpers import TinyModel, make_engine
from workers.jobs.prompt import prompt_token_ids

HERMES = parser_for("hermes")
SCHEMAS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["c", "f"]},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
    "get_time": {
        "type": "object",
        "properties": {"zone": {"type": "string", "maxLength": 8}},
        "additionalProperties": False,
    },
}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
SEEDS = 12
MAX_TOKENS = 200  # the tiny model holds 512 tokens; a call here takes well under 100


def _request(tool_choice: Any, seed: int) -> CompletionRequest:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": TOOLS,
        "tool_choice": tool_choice,
        "parallel_tool_calls": False,
        "temperature": 1.0,
        "seed": seed,
        "max_tokens": MAX_TOKENS,
    }
    return parse_request("/v1/chat/completions", body)


def _run(tiny: TinyModel, tokenizer: object, requests: list[CompletionRequest]) -> list[str]:
    engine = make_engine(tiny.loaded, num_blocks=600, max_num_seqs=64)
    prompts = [prompt_token_ids(r.to_job(), tokenizer) for r in requests]
    outs = engine.generate(prompts, [r.params for r in requests])
    for out in outs:
        assert out.finish_reason == "stop", out.text  # the grammar ended it, not max_tokens
    return [out.text for out in outs]


def test_required_always_calls_a_tool_with_valid_arguments(tiny: TinyModel, tokenizer: object) -> None:
    texts = _run(tiny, tokenizer, [_request("required", seed) for seed in range(SEEDS)])
    names = set()
    for text in texts:
        content, calls = parse(HERMES, text)
        assert content is None and len(calls) == 1, text
        names.add(calls[0].name)
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
    assert len(set(texts)) > 1, "temperature 1 wrote the same call every time"


def test_named_choice_calls_that_function(tiny: TinyModel, tokenizer: object) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    for text in _run(tiny, tokenizer, [_request(named, seed) for seed in range(SEEDS)]):
        _, calls = parse(HERMES, text)
        assert [c.name for c in calls] == ["get_time"], text
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS["get_time"])


TURNS = (
    ChatMessage("user", "Weather in Oslo?"),
    ChatMessage(
        "assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Oslo", "days": 1}'),)
    ),
    ChatMessage("tool", "sunny, 21C", tool_call_id="call_1"),
)
SPECS = (ToolSpec("get_weather", "Weather by city", json.dumps(SCHEMAS["get_weather"])),)


def _text(tokenizer: Any, job: GenerateJob) -> str:
    return str(tokenizer.decode(prompt_token_ids(job, tokenizer)))


def test_smollm2_renders_tools_and_tool_turns_as_hermes_text(tokenizer: Any) -> None:
    text = _text(tokenizer, GenerateJob("m", "chat", TURNS, tools=SPECS))
    assert "<tools>" in text and '"name": "get_weather"' in text and "Weather by city" in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}\n</tool_call>' in text
    )
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = _text(tokenizer, GenerateJob("m", "chat", TURNS[:1]))
    assert "<tools>" not in plain  # no tools (tool_choice none): nothing about them


# A template that knows tools, as Qwen2.5's writes them (cut down): tools listed in the system
# turn, arguments with `| tojson`, a tool message as a user turn in <tool_response>.
NATIVE = (
    "{%- if tools %}<|im_start|>system\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


@pytest.fixture(scope="module")
def native_tokenizer(tokenizer: Any) -> Any:
    t = copy.deepcopy(tokenizer)
    t.chat_template = NATIVE
    return t


def test_a_template_with_tools_gets_openai_shapes(native_tokenizer: Any) -> None:
    text = _text(native_tokenizer, GenerateJob("m", "chat", TURNS, tools=SPECS))
    listed = json.loads(text.split("<tools>")[1].split("</tools>")[0])
    assert listed == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather by city",
            "parameters": SCHEMAS["get_weather"],
        },
    }
    # arguments reach the template as a dict: tojson writes them once, not as a quoted string
    assert '"arguments": {"city": "Oslo", "days": 1}' in text
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in text


def test_a_session_continues_through_tool_turns(tokenizer: Any) -> None:
    """A turn that sends a call back as tool_calls re-tokenises (the stored reply is its text);
    the next turn continues that conversation's exact ids, tool messages and all."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}\n</tool_call>'
    prompt1 = prompt_token_ids(GenerateJob("m", "chat", TURNS[:1], tools=SPECS), tokenizer)
    out1 = [*tokenizer(reply, add_special_tokens=False)["input_ids"], im_end]
    stored = after_turn(None, "m", (*TURNS[:1], ChatMessage("assistant", reply)), prompt1 + out1)

    turn2 = GenerateJob("m", "chat", TURNS, tools=SPECS)
    ids2 = prompt_token_ids(turn2, tokenizer, stored)
    assert ids2 == prompt_token_ids(turn2, tokenizer)

    answer = "It is sunny."
    out2 = [*tokenizer(answer, add_special_tokens=False)["input_ids"], im_end]
    stored = after_turn(stored, "m", (*TURNS, ChatMessage("assistant", answer)), ids2 + out2)
    turn3 = GenerateJob(
        "m", "chat", (*TURNS, ChatMessage("assistant", answer), ChatMessage("user", "Thanks")), tools=SPECS
    )
    head = stored.head_for("m", turn3.messages)
    assert head == tuple(ids2 + out2)  # the tool turns' digest matches: the exact ids are reused
    ids3 = prompt_token_ids(turn3, tokenizer, stored)
    assert ids3[: len(head)] == list(head)
    assert ids3 == prompt_token_ids(turn3, tokenizer)
    # a conversation that differs only in a call's arguments is another conversation
    edited = (
        TURNS[0],
        ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", "{}"),)),
        *TURNS[2:],
    )
    assert stored.head_for("m", (*edited, ChatMessage("assistant", answer), ChatMessage("user", "x"))) is None
