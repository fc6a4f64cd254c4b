"""`kvferry bench api-features`: what structured outputs, logprobs and n choices cost, each as a
ratio against the same work without the feature, measured in the same run on the engine itself
(add_request + step loop: the queue's cost is not in it).

Ratios: TPOT of a batch where half the requests follow a JSON schema vs none; TPOT with 5 top
logprobs on every request vs none (both in alternated pairs, ops/bench/paired.py, with the ITL
ratios of the same pairs); pool blocks held by n=8 choices of one prompt vs n=1, and the prompt
tokens each computed. Figures: compile time of the grammar_schemas.py schemas on a cold compiler
cache; the fraction of constrained outputs at temperature 1 that validate."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import torch
from tqdm import tqdm

from broker.sampling import SamplingParams
from ops.bench.engine.hf_baseline import prompt
from ops.bench.features import costs as fc
from ops.bench.grammar.schemas import SCHEMAS
from ops.bench.machine import cpu_model
from ops.bench.paired import Pairs, alternate
from ops.settings import Settings
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import load_model

# (JSON key, what it compares, the target it should meet: at most, or exactly for a rate)
TARGETS = (
    ("constrained_tpot_ratio", "TPOT, 8 of 16 requests under a JSON schema vs none", "<= 1.10"),
    ("constrained_itl_ratio", "the same runs' ITL (a stalled step moves it less)", "-"),
    ("logprobs_tpot_ratio", "TPOT, top_logprobs=5 on every request vs none", "<= 1.05"),
    ("logprobs_itl_ratio", "the same runs' ITL", "-"),
    ("n8_pool_ratio", "pool blocks held, n=8 choices of one prompt vs n=1", "<= 1.15"),
    ("n8_prompt_tokens_computed_ratio", "prompt tokens computed, n=8 vs n=1", "-"),
    ("json_valid_rate", "constrained outputs that validate (temperature 1)", "= 1.0"),
    ("grammar_compile_ms_p50", "compile of one JSON schema, cold cache (ms)", "-"),
)


@dataclass(frozen=True, slots=True)
class Sizes:
    requests: int = 16  # the batch of the TPOT ratios
    prompt_tokens: int = 64  # each request's prompt in those batches
    new_tokens: int = 64  # each request's output in those batches
    pairs: int = 7
    per_schema: int = 5  # constrained outputs per schema for json_valid_rate
    json_max_tokens: int = 400  # far more than any grammar_schemas.py schema takes
    n: int = 8
    n_prompt_tokens: int = 1000


FULL = Sizes()
QUICK = Sizes(new_tokens=16, pairs=5, per_schema=2)
_Run = Callable[[list[SamplingParams]], fc.BatchTiming]


def _paired(
    name: str, ours: list[SamplingParams], baseline: list[SamplingParams], run: _Run, sizes: Sizes, bar: tqdm
) -> dict[str, Any]:
    """`name`_tpot_ratio: TPOT of `ours` vs `baseline`, in alternated pairs; `name`_itl_ratio:
    their ITLs, from the same runs (so the same pairs)."""
    itl: dict[int, list[float]] = {0: [], 1: []}

    def side(k: int, params: list[SamplingParams]) -> Callable[[], float]:
        def measure() -> float:
            got = run(params)
            itl[k].append(got.itl_s)
            bar.update()
            return got.tpot_s

        return measure

    tpot = alternate(side(0, ours), side(1, baseline), sizes.pairs)
    # alternate() warms each side up first: its runs are the first of each list
    itls = Pairs.of(itl[0][-sizes.pairs :], itl[1][-sizes.pairs :])
    return {
        f"{name}_tpot_ms": 1e3 * tpot.ours_median,
        f"{name}_tpot_baseline_ms": 1e3 * tpot.baseline_median,
        f"{name}_tpot_ratio": tpot.ratio,
        f"{name}_tpot_ratio_pairs": tpot.table(),
        f"{name}_itl_ratio": itls.ratio,
        f"{name}_itl_ratio_pairs": itls.table(),
    }


def tpot_ratios(engine: LLMEngine, sizes: Sizes, vocab: int, bar: tqdm) -> dict[str, Any]:
    rng = torch.Generator().manual_seed(11)
    prompts = [prompt(rng, sizes.prompt_tokens, vocab) for _ in range(sizes.requests)]
    plain = SamplingParams(max_tokens=sizes.new_tokens, temperature=1.0, ignore_eos=True)
    # Every other request constrained, each by its own schema; its grammar ends it, not EOS.
    schemas = [SCHEMAS[(i // 2) % len(SCHEMAS)][1] for i in range(sizes.requests)]
    constrained = [
        msgspec.structs.replace(
            plain,
            ignore_eos=False,
            structured_outputs=fc.response_format(fc.long_schema(s, sizes.new_tokens)),
        )
        if i % 2
        else plain
        for i, s in enumerate(schemas)
    ]
    with_logprobs = msgspec.structs.replace(plain, logprobs=5)

    def run(params: list[SamplingParams]) -> fc.BatchTiming:
        engine.pool.reset_prefix_cache()  # every run prefills its prompts alike
        return fc.batch_timing(engine, prompts, params)

    baseline = [plain] * sizes.requests
    out = _paired("constrained", constrained, baseline, run, sizes, bar)
    out.update(_paired("logprobs", [with_logprobs] * sizes.requests, baseline, run, sizes, bar))
    return out


def n_choices(make_engine: Callable[[], LLMEngine], sizes: Sizes, vocab: int, bar: tqdm) -> dict[str, Any]:
    one_prompt = prompt(torch.Generator().manual_seed(13), sizes.n_prompt_tokens, vocab)
    got = {}
    for n in (sizes.n, 1):
        got[n] = fc.n_choices_blocks(make_engine, one_prompt, n)
        gc.collect()  # the engine's pool goes before the next one is allocated
        bar.update()
    many, one = got[sizes.n], got[1]
    return {
        "n8_pool_ratio": many["blocks_peak_used"] / one["blocks_peak_used"],
        "n8_prompt_tokens_computed_ratio": many["prompt_tokens_computed"] / one["prompt_tokens_computed"],
        "n8_blocks_peak_used": many["blocks_peak_used"],
        "n1_blocks_peak_used": one["blocks_peak_used"],
        "n8_prompt_tokens_computed": many["prompt_tokens_computed"],
        "n1_prompt_tokens_computed": one["prompt_tokens_computed"],
        "n_prompt_tokens": sizes.n_prompt_tokens,
        "n_output_tokens_each": many["output_tokens_each"],
        "n": sizes.n,
    }


def table(results: dict[str, Any]) -> str:
    rows = [("measure", "key", "value", "target")]
    rows += [(what, key, f"{results[key]:.3f}", target) for key, what, target in TARGETS if key in results]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def run_api_features_bench(
    settings: Settings, quick: bool = False, sizes: Sizes | None = None
) -> dict[str, Any]:
    sizes = sizes or (QUICK if quick else FULL)
    loaded = load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)
    vocab = int(loaded.model.config.vocab_size)
    base = settings.engine_config()
    # each part's requests in one step: the TPOT batch, the validity batch, the n choices
    widest = max(sizes.requests, sizes.per_schema * len(SCHEMAS), sizes.n)
    config = replace(base, max_num_seqs=max(base.max_num_seqs, widest))
    results: dict[str, Any] = {
        "model": loaded.model_id,
        "cpu": cpu_model(),
        "requests": sizes.requests,
        "quick": quick,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "new_tokens": sizes.new_tokens,
        "pairs": sizes.pairs,
    }
    total = 2 + 4 * (sizes.pairs + 1) + 2  # compiles, validity, two paired parts with warm-ups, n
    with tqdm(total=total, desc="api-features", unit="run", leave=False) as bar:
        engine = build_engine(config, loaded)
        results["grammar_tokenizer_build_ms"] = fc.tokenizer_build_ms(engine.served.grammars)
        results.update(fc.compile_times(engine.served.grammars, [s for _, s, _ in SCHEMAS]))
        bar.update()
        rng = torch.Generator().manual_seed(12)
        prompts = [prompt(rng, 32, vocab) for _ in range(sizes.per_schema * len(SCHEMAS))]
        results.update(fc.json_validity(engine, prompts, sizes.per_schema, sizes.json_max_tokens))
        bar.update()
        results.update(tpot_ratios(engine, sizes, vocab, bar))
        del engine
        gc.collect()
        results.update(n_choices(lambda: build_engine(config, loaded), sizes, vocab, bar))
    results["torch_threads"] = torch.get_num_threads()  # an engine may have set it (--torch-threads)
    print(table(results), flush=True)
    return results
