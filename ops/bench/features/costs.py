"""What each API feature costs the engine, measured on it directly (add_request + step loop, no
queue): TPOT of a batch, grammar compiles, validity of constrained outputs, pool blocks held by n
choices. Part of `kvferry bench api-features` (ops/bench/features/run.py)."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from broker.sampling import SamplingParams
from broker.structured import StructuredOutputs
from ops.bench.grammar.schemas import SCHEMAS
from workers.engine.grammar.compiler import GrammarCompiler
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.request import GenerationRequest

_ids = itertools.count()


def response_format(schema: dict[str, Any]) -> StructuredOutputs:
    """A json_schema constraint as the api builds one from `response_format`."""
    return StructuredOutputs(json=json.dumps(schema), source="response_format")


def long_schema(schema: dict[str, Any], items: int) -> dict[str, Any]:
    """An array of exactly `items` instances of `schema`: no instance of it is shorter than a few
    tokens per item, so a constrained request outlasts a max_tokens below that and stays in the
    batch as long as its unconstrained batch-mates (a request ending early would shrink the batch
    and speed up the steps it leaves)."""
    return {"type": "array", "items": schema, "minItems": items, "maxItems": items}


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """One batch's figures, each the median over its requests of that request's own: TPOT,
    seconds from its first token to its last over the tokens after the first; ITL, the median gap
    between its consecutive tokens (one stalled step, e.g. another job taking the cores, moves a
    TPOT but not an ITL)."""

    tpot_s: float
    itl_s: float


def batch_timing(
    engine: LLMEngine, prompts: Sequence[list[int]], params: Sequence[SamplingParams]
) -> BatchTiming:
    """The requests added together, then stepped until all are done."""
    rids = [f"feature-{next(_ids)}" for _ in prompts]
    for rid, prompt, p in zip(rids, prompts, params, strict=True):
        engine.add_request(GenerationRequest(rid, prompt, p))
    arrivals: dict[str, list[float]] = {rid: [] for rid in rids}  # one time per token
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            arrivals[out.request_id] += [now] * len(out.delta_token_ids)
    times = [t for t in arrivals.values() if len(t) > 1]
    if not times:
        raise RuntimeError("no request made two tokens: TPOT needs max_tokens >= 2")
    return BatchTiming(
        tpot_s=statistics.median((t[-1] - t[0]) / (len(t) - 1) for t in times),
        itl_s=statistics.median(statistics.median(b - a for a, b in itertools.pairwise(t)) for t in times),
    )


def compile_times(compiler: GrammarCompiler, schemas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each schema compiled once through `compiler`, whose cache must be cold: every compile is a
    miss. Then each again: a hit. Raises if a first compile was a hit."""
    compiles_before, hits_before = compiler.compiles, compiler.hits
    misses: list[float] = []
    for schema in schemas:
        started = time.perf_counter()
        compiler.compile(response_format(schema))
        misses.append(time.perf_counter() - started)
    if compiler.compiles - compiles_before != len(schemas) or compiler.hits != hits_before:
        raise RuntimeError(f"cache not cold: {compiler.hits - hits_before} hits among {len(schemas)} schemas")
    hits: list[float] = []
    for schema in schemas:
        started = time.perf_counter()
        compiler.compile(response_format(schema))
        hits.append(time.perf_counter() - started)
    return {
        "grammar_compile_ms_p50": 1e3 * statistics.median(misses),
        "grammar_compile_ms_max": 1e3 * max(misses),
        "grammar_cache_hit_us_p50": 1e6 * statistics.median(hits),
        "grammar_schemas": len(schemas),
    }


def tokenizer_build_ms(compiler: GrammarCompiler) -> float:
    """The compiler's one-time tokenizer conversion, paid by its first compile of anything: done
    here with a regex that no measured schema shares, so that the medians hold compiles alone."""
    started = time.perf_counter()
    compiler.compile(StructuredOutputs(regex="[a-z]{1,4}", source="response_format"))
    return 1e3 * (time.perf_counter() - started)


def json_validity(
    engine: LLMEngine, prompts: Sequence[list[int]], per_schema: int, max_tokens: int
) -> dict[str, Any]:
    """`per_schema` outputs at temperature 1 for each schema of grammar_schemas.py, in one batch:
    the fraction that parse and validate. An output cut by max_tokens counts as a failure, and
    is counted apart too."""
    cases = [schema for _, schema, _ in SCHEMAS for _ in range(per_schema)]
    params = [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, structured_outputs=response_format(s))
        for s in cases
    ]
    outs = engine.generate(list(prompts[: len(cases)]), params)
    valid = cut = 0
    for out, schema in zip(outs, cases, strict=True):
        if out.finish_reason == "length":
            cut += 1
            continue
        try:
            jsonschema.validate(json.loads(out.text), schema)
        except (ValueError, jsonschema.ValidationError):
            continue
        valid += 1
    return {
        "json_valid_rate": valid / len(outs),
        "json_outputs": len(outs),
        "json_cut_by_length": cut,
        "json_max_tokens": max_tokens,
    }


def n_choices_blocks(make_engine: Callable[[], LLMEngine], prompt: list[int], n: int) -> dict[str, int]:
    """n requests of one prompt submitted together (as the api fans out `n`), each with its own
    seed at temperature 1, on a fresh engine: its pool's peak used blocks and the prompt tokens it
    computed. Each makes as many tokens as the prompt's partial last block has room for, plus one
    (the last token's KV is never computed): no output needs a block of its own, and no choice
    ends before the others are in (with one token, the first would free its last block before the
    others, deferred behind its prefill, take theirs)."""
    engine = make_engine()
    room = -len(prompt) % engine.pool.block_size
    params = [SamplingParams(max_tokens=room + 1, temperature=1.0, seed=i, ignore_eos=True) for i in range(n)]
    engine.generate([prompt] * n, params)
    stats = engine.stats()
    return {
        "blocks_peak_used": stats.pool.blocks_peak_used,
        "prompt_tokens_computed": stats.prompt_tokens_computed,
        "output_tokens_each": room + 1,
    }
