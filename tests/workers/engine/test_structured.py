"""Structured outputs in the engine: every sampled output follows its schema, regex or choice;
unconstrained batch-mates are untouched; a resumed request replays into a fresh matcher; a bad
spec is refused before anything is queued; each spec is compiled once."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from broker.errors import InvalidRequestError
from broker.sampling import SamplingParams
from broker.structured import StructuredOutputs
from ops.bench.grammar.schemas import CHOICES, REGEX, SCHEMAS
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.grammar.compiler import GrammarCompiler
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.loop.engine_loop import EngineLoop

PER_SCHEMA = 20
# Far more than any schema of grammar_schemas.py can take: an output cut by length is a failure.
MAX_TOKENS = 400


def _schema(schema: object) -> StructuredOutputs:
    return StructuredOutputs(json=json.dumps(schema))


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [random_prompt(rng, rng.randrange(3, 20)) for _ in range(n)]


def test_sampled_json_follows_every_schema(tiny: TinyModel) -> None:
    """200 outputs at temperature 1 over ten schemas, in one batch: every one parses and
    validates, none is cut by length."""
    engine = make_engine(tiny.loaded, num_blocks=1200, max_num_seqs=256)
    params = []
    for i, (_, schema, _) in enumerate(SCHEMAS):
        for j in range(PER_SCHEMA):
            # a few seeded (drawn row by row, a slower path), the rest not (the batched draw)
            seed = 1000 * i + j if j < 2 else None
            params.append(
                SamplingParams(
                    max_tokens=MAX_TOKENS, temperature=1.0, seed=seed, structured_outputs=_schema(schema)
                )
            )
    outs = engine.generate(_prompts(1, len(params)), params)

    failures = []
    for k, out in enumerate(outs):
        name, schema, _ = SCHEMAS[k // PER_SCHEMA]
        try:
            assert out.finish_reason == "stop", f"finished by {out.finish_reason}"
            jsonschema.validate(json.loads(out.text), schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{name}: {out.text!r}: {exc}")
    assert not failures, f"{len(failures)} of {len(outs)} failed:\n" + "\n".join(failures[:10])
    assert engine.served.grammars.compiles == len(SCHEMAS)


def test_regex_and_choice_outputs_match(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=256)
    regex = SamplingParams(max_tokens=64, temperature=1.0, structured_outputs=StructuredOutputs(regex=REGEX))
    choice = SamplingParams(
        max_tokens=64, temperature=1.0, structured_outputs=StructuredOutputs(choice=tuple(CHOICES))
    )
    outs = engine.generate(_prompts(2, 40), [regex] * 20 + [choice] * 20)
    for out in outs[:20]:
        assert out.finish_reason == "stop" and re.fullmatch(REGEX, out.text), out
    for out in outs[20:]:
        assert out.finish_reason == "stop" and out.text in CHOICES, out
    assert len({o.text for o in outs[20:]}) > 1, "temperature 1 never picked another choice"


def test_unconstrained_batch_mates_stay_token_exact(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=128)
    prompts = _prompts(3, 6)
    plain = SamplingParams(max_tokens=20, **NO_EOS)
    constrained = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, structured_outputs=_schema(schema))
        for _, schema, _ in SCHEMAS[:3]
    ]
    outs = engine.generate(prompts, [plain, constrained[0], plain, constrained[1], plain, constrained[2]])
    for i in (0, 2, 4):
        assert_tokens(outs[i].token_ids, tiny.expected(prompts[i], 20), f"plain row {i} beside grammars")
    for out in outs[1::2]:
        json.loads(out.text)


def _run(
    engine: object, request_id: str, prompt: list[int], params: SamplingParams, **kw: object
) -> RequestOutput:
    engine.add_request(GenerationRequest(request_id, prompt, params, **kw))  # type: ignore[attr-defined]
    return run_checked(engine)[request_id]  # type: ignore[arg-type]


def test_resumed_request_replays_into_a_fresh_matcher(tiny: TinyModel) -> None:
    """A redelivered job's tokens are replayed: greedy, it ends exactly as if uninterrupted;
    resumed with its whole output, it is complete at once."""
    prompt = _prompts(4, 1)[0]
    params = SamplingParams(max_tokens=MAX_TOKENS, structured_outputs=_schema(SCHEMAS[4][1]))
    whole = _run(make_engine(tiny.loaded, num_blocks=64), "a", prompt, params)
    assert whole.finish_reason == "stop" and len(whole.token_ids) > 4

    cut = list(whole.token_ids[:4])
    resumed = _run(make_engine(tiny.loaded, num_blocks=64), "b", prompt, params, output_token_ids=cut)
    assert_tokens(resumed.token_ids, whole.token_ids, "resumed after 4 tokens")
    assert resumed.text == whole.text

    done = _run(
        make_engine(tiny.loaded, num_blocks=64), "c", prompt, params, output_token_ids=list(whole.token_ids)
    )
    assert done.finish_reason == "stop" and done.token_ids == whole.token_ids


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        (StructuredOutputs(regex="a{3", source="guided_regex"), "guided_regex"),
        (StructuredOutputs(json='{"type": "foo"}', source="response_format"), "response_format"),
        (StructuredOutputs(grammar="start: nowhere"), "structured_outputs"),
        (StructuredOutputs(grammar="root ::= ::=", source="guided_grammar"), "guided_grammar"),
    ],
    ids=["regex", "schema", "lark", "gbnf"],
)
def test_bad_spec_is_refused_before_anything_is_queued(
    tiny: TinyModel, spec: StructuredOutputs, param: str
) -> None:
    engine = make_engine(tiny.loaded, num_blocks=16)
    with pytest.raises(InvalidRequestError) as caught:
        engine.served.grammars.compile(spec)  # what a job's task thread does first
    assert caught.value.param == param
    with pytest.raises(InvalidRequestError) as caught:
        engine.add_request(GenerationRequest("r", [1, 2, 3], SamplingParams(structured_outputs=spec)))
    assert caught.value.param == param
    assert not engine.has_unfinished()
    engine.check_integrity()


def test_bad_spec_fields_are_refused_on_decode() -> None:
    """What msgspec decodes (a Celery message) runs the same checks as the api's constructor."""
    for kwargs in (
        {},
        {"regex": "a", "choice": ("b",)},
        {"json": "[1]"},
        {"json": "{"},
        {"choice": ()},
        {"regex": ""},
    ):
        with pytest.raises(InvalidRequestError) as caught:
            StructuredOutputs(**kwargs)  # type: ignore[arg-type]
        assert caught.value.param == "structured_outputs"


def test_each_spec_is_compiled_once(tokenizer: object) -> None:
    compiler = GrammarCompiler(tokenizer, {2}, capacity=2)
    a = StructuredOutputs(regex="[ab]+")
    same = StructuredOutputs(regex="[ab]+", source="guided_regex")  # the same grammar, another field
    first = compiler.compile(a)
    assert compiler.compile(same) is first and compiler.compile(a) is first
    assert (compiler.compiles, compiler.hits) == (1, 2)
    assert compiler.compile(None) is None

    compiler.compile(StructuredOutputs(regex="c"))
    compiler.compile(a)  # a is the most recent: d evicts c
    compiler.compile(StructuredOutputs(regex="d"))
    assert len(compiler) == 2 and compiler.compile(a) is first
    assert compiler.compiles == 3


def test_loop_takes_a_grammar_compiled_by_the_submitter(tiny: TinyModel) -> None:
    """The job path: the task thread compiles (a bad spec raises there, on its thread), the loop
    gets the compiled grammar with the Submit."""
    engine = make_engine(tiny.loaded, num_blocks=64)
    with EngineLoop(engine) as loop:
        spec = _schema(SCHEMAS[1][1])
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, structured_outputs=spec)
        grammar = loop.grammars.compile(spec)
        final = list(loop.submit(GenerationRequest.new([5, 6, 7], params, grammar=grammar)))[-1]
        assert final.finish_reason == "stop"
        jsonschema.validate(json.loads(final.text), SCHEMAS[1][1])
        assert loop.grammars.compiles == 1 and loop.grammars.hits == 0  # the loop did not compile again


def test_a_broken_matcher_fails_its_request_alone(tiny: TinyModel) -> None:
    """A matcher in an error state (here: fed a token its grammar refuses) fails its request with
    finish_reason "error"; its constrained and unconstrained batch-mates finish as usual."""
    engine = make_engine(tiny.loaded, num_blocks=64)
    spec = _schema(SCHEMAS[1][1])
    prompts = _prompts(5, 3)
    engine.add_request(
        GenerationRequest(
            "broken", prompts[0], SamplingParams(max_tokens=MAX_TOKENS, structured_outputs=spec)
        )
    )
    engine.add_request(
        GenerationRequest("good", prompts[1], SamplingParams(max_tokens=MAX_TOKENS, structured_outputs=spec))
    )
    engine.add_request(GenerationRequest("plain", prompts[2], SamplingParams(max_tokens=8, **NO_EOS)))
    broken = engine._seqs["broken"].grammar
    assert broken is not None and not broken.ll.consume_token(int(tiny.loaded.tokenizer.encode("x")[0]))

    outs = run_checked(engine)
    assert outs["broken"].finish_reason == "error" and "grammar" in (outs["broken"].error or "")
    jsonschema.validate(json.loads(outs["good"].text), SCHEMAS[1][1])
    assert_tokens(outs["plain"].token_ids, tiny.expected(prompts[2], 8), "plain beside a broken matcher")
