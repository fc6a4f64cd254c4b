"""xgrammar vs llguidance on the served tokenizer (SmolLM2's): what choosing the structured-output
engine rests on (docs/benchmarks.md, the EPYC with AVX-512 table).

For each engine: building its tokenizer view, compiling the ten schemas of
ops/bench/grammar/schemas.py plus a regex and a choice (cold: no cache), the first mask of each
and every later mask-fill along a valid output (its tokens as the tokenizer splits it), and
whether the api could validate a spec without importing torch (each import in a fresh
interpreter). Then what the engine's masking (workers/engine/grammar/masks.py, on llguidance)
adds to a 16-row step with 0, 1 or 16 rows constrained. Run: `python -m ops.bench.grammar.engines`
(prints the figures and ratios; xgrammar is no dependency of kvferry: install it to compare)."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.bench.grammar.schemas import CHOICES, REGEX, REGEX_EXAMPLE, SCHEMAS

SEPARATORS = (", ", ": ")
_IMPORT_PROBE = (
    "import sys, time; t = time.perf_counter(); import {module}; "
    "print(time.perf_counter() - t, 'torch' in sys.modules)"
)


def _specs() -> list[tuple[str, str, str, str]]:
    """(name, kind, spec text, a valid output) for every spec measured."""
    out = [
        (name, "json", json.dumps(schema), json.dumps(example, separators=SEPARATORS))
        for name, schema, example in SCHEMAS
    ]
    out.append(("regex", "regex", REGEX, REGEX_EXAMPLE))
    out.append(("choice", "choice", json.dumps(CHOICES), CHOICES[1]))
    return out


def _import(module: str) -> dict[str, Any]:
    probe = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, torch = probe.stdout.split()
    return {"import_s": float(seconds), "imports_torch": torch == "True"}


class _Llguidance:
    def __init__(self, tokenizer: Any) -> None:
        import llguidance
        import llguidance.hf
        import numpy as np

        self.llg, self.np = llguidance, np
        started = time.perf_counter()
        self.tok = llguidance.hf.from_tokenizer(tokenizer)
        self.tokenizer_s = time.perf_counter() - started
        self.mask = np.zeros(((self.tok.vocab_size + 31) // 32,), dtype=np.int32)

    def grammar(self, kind: str, text: str) -> str:
        m = self.llg.LLMatcher
        if kind == "json":
            options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
            return m.grammar_from_json_schema(text, defaults=options)  # type: ignore[arg-type]
        return self.llg.grammar_from(kind, text)  # type: ignore[arg-type]

    def compile(self, kind: str, text: str) -> Any:
        matcher = self.llg.LLMatcher(self.tok, self.grammar(kind, text))
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def fill(self, matcher: Any) -> None:
        matcher.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def validate(self, kind: str, text: str) -> str:
        return str(self.llg.LLMatcher.validate_grammar(self.grammar(kind, text)))


class _Xgrammar:
    def __init__(self, tokenizer: Any) -> None:
        import xgrammar

        self.xgr = xgrammar
        started = time.perf_counter()
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        self.tokenizer_s = time.perf_counter() - started
        # two threads: the cores this benchmark's machine has; no cache, so every compile is cold
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.mask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def compile(self, kind: str, text: str) -> Any:
        c = self.compiler
        if kind == "json":
            compiled = c.compile_json_schema(text, any_whitespace=False, separators=SEPARATORS)
        elif kind == "regex":
            compiled = c.compile_regex(text)
        else:
            choices = " | ".join(json.dumps(x) for x in json.loads(text))
            compiled = c.compile_grammar(f"root ::= {choices}")
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any) -> None:
        matcher.fill_next_token_bitmask(self.mask, 0)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))


def _time(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def _engine(engine: _Llguidance | _Xgrammar, tokenizer: Any) -> dict[str, Any]:
    compile_s: dict[str, float] = {}
    first_mask_s: dict[str, float] = {}
    fills: list[float] = []
    rejected: list[str] = []
    for name, kind, text, example in _specs():
        compile_s[name], matcher = _time(lambda k=kind, t=text: engine.compile(k, t))  # type: ignore[misc]
        tokens = tokenizer.encode(example, add_special_tokens=False)
        for i, token in enumerate(tokens):
            seconds, _ = _time(lambda m=matcher: engine.fill(m))  # type: ignore[misc]
            if i == 0:
                first_mask_s[name] = seconds
            else:
                fills.append(seconds)
            if not engine.accept(matcher, token):
                rejected.append(name)
                break
    return {
        "tokenizer_s": engine.tokenizer_s,
        "compile_s": compile_s,
        "compile_total_s": sum(compile_s.values()),
        "first_mask_total_s": sum(first_mask_s.values()),
        "fill_us_median": statistics.median(fills) * 1e6,
        "fill_us_mean": statistics.fmean(fills) * 1e6,
        "fill_us_p95": statistics.quantiles(fills, n=20)[-1] * 1e6,
        "fill_us_max": max(fills) * 1e6,
        "fills": len(fills),
        "rejected_examples": rejected,
    }


def _masking(tokenizer: Any, rows: int = 16, rounds: int = 20) -> dict[str, float]:
    """Median ms of masks.apply on [rows, vocab] logits with 0, 1 and all rows constrained, each
    matcher inside a JSON string (where most of the vocabulary is allowed). Torch on one thread:
    on two shared, busy cores any op of a two-thread team can wait a scheduler tick, which would
    measure the machine, not the masks."""
    import torch

    torch.set_num_threads(1)
    from broker.structured import StructuredOutputs
    from workers.engine.grammar import masks
    from workers.engine.grammar.compiler import GrammarCompiler

    schema = SCHEMAS[0][1]
    compiled = GrammarCompiler(tokenizer, [tokenizer.eos_token_id]).compile(
        StructuredOutputs(json=json.dumps(schema))
    )
    assert compiled is not None
    prefix = tokenizer.encode('{"name": "Ad', add_special_tokens=False)
    logits = torch.randn(rows, len(tokenizer))
    out = {}
    for constrained in (0, 1, rows):
        matchers: list[Any] = [None] * rows
        for i in range(constrained):
            matchers[i] = compiled.matcher()
            matchers[i].replay(prefix)
        times = [_time(lambda m=matchers: masks.apply(logits, m))[0] for _ in range(rounds)]  # type: ignore[misc]
        out[f"mask_step_ms_{constrained}_of_{rows}"] = statistics.median(times) * 1e3
    return out


def run(tokenizer: Any) -> dict[str, Any]:
    """Both engines' figures on `tokenizer` (an HF fast tokenizer); xgrammar's if installed."""
    llg = _Llguidance(tokenizer)
    out: dict[str, Any] = {"llguidance": {**_engine(llg, tokenizer), **_import("llguidance")}}
    with contextlib.suppress(ImportError):  # xgrammar is not installed
        out["xgrammar"] = {**_engine(_Xgrammar(tokenizer), tokenizer), **_import("xgrammar")}
    out["engine"] = _masking(tokenizer)
    specs = _specs()
    validate_s, _ = _time(lambda: [llg.validate(kind, text) for _, kind, text, _ in specs])
    out["llguidance"]["validate_no_tokenizer_s"] = validate_s / len(specs)
    return out


def main() -> None:
    from transformers import AutoTokenizer

    from workers.engine.model.loader import resolve_model_dir

    directory = resolve_model_dir("smollm2", Path.home() / ".cache" / "kvferry")
    figures = run(AutoTokenizer.from_pretrained(directory))
    print(json.dumps(figures, indent=2))
    if "xgrammar" not in figures:
        return
    llg, xgr = figures["llguidance"], figures["xgrammar"]
    for key in (
        "tokenizer_s",
        "compile_total_s",
        "first_mask_total_s",
        "fill_us_median",
        "fill_us_mean",
        "fill_us_p95",
        "fill_us_max",
    ):
        print(f"{key}: llguidance / xgrammar = {llg[key] / xgr[key]:.3g}")


if __name__ == "__main__":
    main()
