"""The Hermes tool-call parser: whole outputs, and streams cut anywhere giving the same calls."""

from __future__ import annotations

import json
import random

import llguidance
import pytest

from api.tool_calls.parser import CallPiece, ContentPiece, ParsedCall, parse
from api.tool_calls.registry import parser_for
from broker.messages import ToolSpec

HERMES = parser_for("hermes")
WEATHER = (
    '<tool_call>\n{"name": "get_weather", '
    '"arguments": {"city": "Paris", "days": [1, {"n": 2}]}}\n</tool_call>'
)
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def test_one_call() -> None:
    content, calls = parse(HERMES, WEATHER)
    assert content is None
    assert calls == [ParsedCall("get_weather", '{"city": "Paris", "days": [1, {"n": 2}]}')]


def test_several_calls_and_text_around_them() -> None:
    content, calls = parse(HERMES, f"Let me look.\n{WEATHER}\n{TIME}\nDone.")
    assert content == "Let me look.\n\n\nDone."  # the newlines around each call stay
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[1].arguments) == {}


def test_arguments_first_and_unclosed_call() -> None:
    _, calls = parse(HERMES, '<tool_call>{"arguments": {"a": "x"}, "name": "f"}</tool_call>')
    assert calls == [ParsedCall("f", '{"a": "x"}')]
    _, calls = parse(HERMES, '<tool_call>\n{"name": "f", "arguments": {"a": 1}}')  # max_tokens hit at the end
    assert calls == [ParsedCall("f", '{"a": 1}')]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>',
        '<tool_call>\n{"nom": "f"}\n</tool_call>',
        f'{WEATHER}\n<tool_call>\n{{"name": "f", "arguments": {{"a": 1\n</tool_call>',
        "no call here",
        "",
    ],
)
def test_what_does_not_parse_is_all_content(text: str) -> None:
    assert parse(HERMES, text) == (text, [])


def test_a_cut_keeps_the_complete_calls_and_drops_the_open_one() -> None:
    cut = f'Sure.\n{WEATHER}\n<tool_call>\n{{"name": "get_time", "argu'  # max_tokens hit here
    assert parse(HERMES, cut, cut=True) == (
        "Sure.",
        [ParsedCall("get_weather", '{"city": "Paris", "days": [1, {"n": 2}]}')],
    )
    assert parse(HERMES, cut) == (cut, [])  # not a cut (a stop): as before, all content
    stream = HERMES.stream()
    pieces = [*stream.feed(cut), *stream.finish(cut=True)]
    assert not stream.failed and [c.name for c in stream.calls] == ["get_weather"]
    assert all("<tool_call>" not in p.text for p in pieces if isinstance(p, ContentPiece))


def _streamed(text: str, rng: random.Random) -> tuple[str, list[ParsedCall]]:
    """Feed text in random pieces; rebuild content and calls from the pieces, as a client does."""
    stream = HERMES.stream()
    pieces = []
    at = 0
    while at < len(text):
        step = rng.randint(1, 7)
        pieces += stream.feed(text[at : at + step])
        at += step
    pieces += stream.finish()
    content = "".join(p.text for p in pieces if isinstance(p, ContentPiece))
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for p in pieces:
        if isinstance(p, CallPiece):
            if p.name is not None:
                assert p.index not in names  # the name comes once, in the call's first piece
                names[p.index] = p.name
            args[p.index] = args.get(p.index, "") + p.arguments
    assert sorted(names) == list(range(len(names)))
    assert "<tool_call>" not in content and "</tool_call>" not in content
    return content, [ParsedCall(names[i], args[i]) for i in sorted(names)]


@pytest.mark.parametrize(
    "text",
    [
        WEATHER,
        f"Let me look.\n{WEATHER}\n{TIME}\nDone.",
        f"{TIME}{WEATHER}",
        '<tool_call>{"arguments": {"a": "}}"}, "name": "f"}</tool_call> tail',
        '<tool_call>\n{"name": "f", "arguments": {"a": "x"}}',
    ],
)
def test_streams_cut_anywhere_give_the_same_calls(text: str) -> None:
    whole_content, whole_calls = parse(HERMES, text)
    for seed in range(30):
        content, calls = _streamed(text, random.Random(seed))
        assert calls == whole_calls
        assert (content.strip() or None) == whole_content


def test_arguments_stream_in_pieces() -> None:
    stream = HERMES.stream()
    pieces = [p for ch in WEATHER for p in stream.feed(ch)] + stream.finish()
    argument_pieces = [p for p in pieces if isinstance(p, CallPiece) and p.name is None]
    assert len(argument_pieces) > 5


def test_grammar_is_valid_lark_for_llguidance() -> None:
    tools = [
        ToolSpec("get_weather", "", '{"type": "object", "properties": {"city": {"type": "string"}}}'),
        ToolSpec("get_time"),
    ]
    for parallel in (False, True):
        grammar = HERMES.grammar(tools, parallel)
        assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("grammar", grammar)) == ""
