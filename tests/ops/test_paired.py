"""ops/bench/paired.py and the benches' `*_vs_*` ratios built on it: alternated pairs, the same number of
runs on each side, the median of the pairs' ratios, every pair reported. The benches run here on
fake engines and a fake clock, so each ratio can be checked against the pairs it came from."""

from __future__ import annotations

import itertools
import statistics
from types import SimpleNamespace
from typing import Any

import pytest

from ops.bench.engine import decode as bench_decode
from ops.bench.engine import run as bench_engine
from ops.bench.paired import Pairs, alternate


def test_alternate_runs_ours_then_baseline_equally_often() -> None:
    log: list[str] = []
    clock = itertools.count(1)

    def ours() -> float:
        log.append("ours")
        return float(next(clock))

    def baseline() -> float:
        log.append("base")
        return 2.0 * next(clock)

    pairs = alternate(ours, baseline, 3, between=lambda: log.append("|"))
    runs = [x for x in log if x != "|"]
    assert runs == ["ours", "base"] * 4  # a warm-up of each, then 3 pairs
    assert log.count("|") == 8
    assert pairs.ours == (3.0, 5.0, 7.0) and pairs.baseline == (8.0, 12.0, 16.0)
    assert pairs.ratio == statistics.median([3 / 8, 5 / 12, 7 / 16])
    assert [p["ratio"] for p in pairs.table()] == pairs.ratios
    assert alternate(ours, baseline, 1, warmup=False).ours == (9.0,)


def test_pairs_refuse_unequal_counts() -> None:
    with pytest.raises(ValueError):
        Pairs.of([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        Pairs.of([], [])
    with pytest.raises(ValueError):
        alternate(lambda: 1.0, lambda: 1.0, 0)


class _Clock:
    """Seconds that drift upward call by call (as a machine warming up would), by caller."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def take(self, who: str, base: float) -> float:
        self.calls.append(who)
        return base * (1 + 0.05 * len(self.calls))


def _engine(name: str) -> Any:
    runner = SimpleNamespace(fused=object(), decode_kernel=True)
    executor = SimpleNamespace(runner=runner)
    return SimpleNamespace(
        name=name, executor=executor, pool=SimpleNamespace(reset_prefix_cache=lambda: None)
    )


def _adjacent_ratios(calls: list[str], times: list[float], ours: str, other: str) -> list[float]:
    """ours/other of each (ours, other) pair of consecutive timed calls."""
    return [times[i] / times[i + 1] for i in range(len(calls) - 1) if calls[i : i + 2] == [ours, other]]


def test_bench_decode_ratios_come_from_equal_alternated_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    times: list[float] = []
    base = {"ours": 1.0, "plain": 2.0, "modules": 1.5, "gather": 3.0, "hf": 4.0}

    def decode_only(engine: Any, prompts: Any, new_tokens: int) -> float:
        who = "plain" if engine.name == "plain" else "ours"
        if engine.executor.runner.fused is None:
            who = "modules" if engine.executor.runner.decode_kernel else "gather"
        times.append(clock.take(who, base[who]))
        return times[-1]

    def hf_generate(ref: Any, prompts: Any, new_tokens: int, pad: int) -> float:
        if new_tokens == 1:
            return 0.0  # its decode time is then the whole call's
        times.append(clock.take("hf", base["hf"]))
        return times[-1]

    monkeypatch.setattr(bench_decode, "_decode_only", decode_only)
    monkeypatch.setattr(bench_decode, "hf_generate", hf_generate)
    ref = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=2))
    out = bench_decode.bench_decode(
        _engine("ours"), ref, 1000, 4, 8, 9, baselines={"plain_linear": _engine("plain")}, pairs=3
    )
    keys = {"plain": "packed_vs_plain", "modules": "fused_vs_modules", "gather": "kernel_vs_gather"}
    for other, key in keys.items():
        got = _adjacent_ratios(clock.calls, times, "ours", other)
        assert clock.calls.count(other) == 4  # a warm-up, then 3 pairs
        assert [p["ratio"] for p in out[f"decode_{key}_4_pairs"]] == got[1:]
        assert out[f"decode_{key}_4"] == statistics.median(got[1:])
    hf_rates = [1 / r for r in _adjacent_ratios(clock.calls, times, "ours", "hf")[1:]]  # tok/s: ours / HF
    assert out["decode_ratio_vs_hf_equal_len_4"] == pytest.approx(statistics.median(hf_rates))
    assert len(out["decode_ratio_vs_hf_equal_len_4_pairs"]) == 3
    assert clock.calls.count("ours") == 4 * 4  # as often as its four baselines together


def test_bench_throughput_pairs_ours_with_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    times: list[float] = []

    def generate(prompts: Any, params: Any) -> None:
        times.append(clock.take("ours", 1.0))

    def hf_generate(ref: Any, prompts: Any, new_tokens: int, pad: int) -> float:
        times.append(clock.take("hf", 2.0))
        return times[-1]

    monkeypatch.setattr(bench_engine, "hf_generate", hf_generate)
    # ours is timed with perf_counter around engine.generate: a fake clock that reads its seconds
    monkeypatch.setattr(bench_engine, "time", SimpleNamespace(perf_counter=lambda: sum(times)))
    engine = SimpleNamespace(generate=generate, pool=SimpleNamespace(reset_prefix_cache=lambda: None))
    ref = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=2))
    out = bench_engine.bench_throughput(engine, ref, 1000, new_tokens=4, sequential=1, pairs=3)
    for n in (1, 8, 32):
        pairs = out[f"ratio_vs_hf_batched_{n}_pairs"]
        assert len(pairs) == 3
        assert out[f"ratio_vs_hf_batched_{n}"] == statistics.median(p["ratio"] for p in pairs)
    assert len(out["throughput_ratio_vs_sequential_32_pairs"]) == 3
    assert clock.calls.count("ours") == clock.calls.count("hf")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_gemm_ratio_pairs_kvferry_with_the_onednn_run_after_it(
    monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    from ops.bench.engine import gemm as bench_gemm

    clock = _Clock()
    calls: dict[Any, str] = {}
    real_calls = bench_gemm._calls

    def named_calls(*args: Any) -> dict[str, Any]:
        made = real_calls(*args)
        calls.update({fn: impl for impl, fn in made.items()})
        return made

    config = SimpleNamespace(
        hidden_size=8, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16, vocab_size=32
    )
    monkeypatch.setattr(
        bench_gemm, "load_model", lambda *a: SimpleNamespace(model=SimpleNamespace(config=config))
    )
    monkeypatch.setattr(bench_gemm.build, "built", lambda: True)
    monkeypatch.setattr(bench_gemm.bf16_linear, "skinny_runs", lambda: True)
    monkeypatch.setattr(bench_gemm, "_STREAM_BYTES", 1)
    monkeypatch.setattr(bench_gemm, "_calls", named_calls)
    base = {"kvferry": 1.0, "onednn": 2.0, "onednn_plain": 2.5, "f_linear": 3.0}
    monkeypatch.setattr(bench_gemm, "_seconds", lambda fn, budget: clock.take(calls[fn], base[calls[fn]]))
    settings = SimpleNamespace(torch_threads=None, model="m", dtype=dtype, cache_dir=None)
    out = bench_gemm.run_gemm_bench(settings, quick=True)  # type: ignore[arg-type]
    assert out["dtype"] == dtype
    assert ("onednn_plain_gflops" in out["gemm"]["lm_head"]["16"]) is (dtype == "bfloat16")
    entry = out["gemm"]["lm_head"]["16"]
    assert len(entry["kvferry_vs_onednn_pairs"]) == bench_gemm.ROUNDS
    ratios = [p["ratio"] for p in entry["kvferry_vs_onednn_pairs"]]
    assert entry["kvferry_vs_onednn"] == statistics.median(ratios)
    # each pair: kvferry, then oneDNN at once (drift 5 % a call): 1 * (1 + k) / (2 * (1 + k + 0.05))
    assert all(0.47 < r < 0.5 for r in ratios)
    assert clock.calls.count("kvferry") == clock.calls.count("onednn") == clock.calls.count("f_linear")
