"""`kvferry bench api-features` at a tiny scale on a tiny random Llama: every key the issue names is
in the report, each TPOT ratio is the median of its own alternated pairs, and n choices of one
prompt share its full blocks."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from ops.bench.features.run import Sizes, run_api_features_bench, table
from ops.settings import Settings

SIZES = Sizes(requests=4, prompt_tokens=8, new_tokens=4, pairs=2, per_schema=1, n=3, n_prompt_tokens=100)
KEYS = {
    "constrained_tpot_ratio",
    "constrained_tpot_ratio_pairs",
    "logprobs_tpot_ratio",
    "logprobs_tpot_ratio_pairs",
    "constrained_itl_ratio_pairs",
    "logprobs_itl_ratio_pairs",
    "grammar_compile_ms_p50",
    "json_valid_rate",
    "json_cut_by_length",
    "n8_pool_ratio",
    "n8_prompt_tokens_computed_ratio",
    "cpu",
    "torch_threads",
    "requests",
    "quick",
}


@pytest.fixture(scope="module")
def report(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    settings = Settings(model=str(tiny_model_dir), cache_dir=tmp_path_factory.mktemp("cache"))
    return run_api_features_bench(settings, quick=True, sizes=SIZES)


def test_the_report_has_every_key_and_is_json(report: dict[str, Any]) -> None:
    assert not KEYS - report.keys()
    assert report["quick"] is True and report["requests"] == SIZES.requests
    assert report["cpu"] and report["torch_threads"] >= 1
    assert json.loads(json.dumps(report)) == report
    assert "n8_pool_ratio" in table(report)


@pytest.mark.parametrize(
    "key", ["constrained_tpot_ratio", "logprobs_tpot_ratio", "constrained_itl_ratio", "logprobs_itl_ratio"]
)
def test_tpot_ratios_are_the_median_of_their_pairs(report: dict[str, Any], key: str) -> None:
    pairs = report[f"{key}_pairs"]
    assert len(pairs) == SIZES.pairs
    for p in pairs:
        assert p["ours"] > 0 and p["baseline"] > 0 and p["ratio"] == pytest.approx(p["ours"] / p["baseline"])
    assert report[key] == pytest.approx(statistics.median(p["ratio"] for p in pairs))


def test_constrained_outputs_validate(report: dict[str, Any]) -> None:
    assert report["json_outputs"] == 10  # one per schema of grammar_schemas.py
    assert report["json_valid_rate"] == 1.0 and report["json_cut_by_length"] == 0
    assert report["grammar_schemas"] == 10 and report["grammar_compile_ms_p50"] > 0


def test_n_choices_share_the_prompts_full_blocks(report: dict[str, Any]) -> None:
    # 100 tokens in 16-token blocks: 6 full blocks shared, a partial last block per choice.
    assert report["n1_blocks_peak_used"] == 7
    assert report["n8_blocks_peak_used"] == 6 + SIZES.n
    assert report["n8_pool_ratio"] == pytest.approx(9 / 7)
    # the other choices hit the 96 cached tokens, copy 3 of the first's partial block and compute
    # their last token alone
    assert report["n8_prompt_tokens_computed"] == 100 + (SIZES.n - 1)
