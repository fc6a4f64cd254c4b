"""`kvferry bench lm-eval`'s parts that need no lm-eval: the local task's questions, and a mode's
figures against HF fp32's (points, answers changed, the largest loglikelihood difference)."""

from __future__ import annotations

import json

import pytest

from ops.bench.quality.lm_eval_bench import LM_EVAL_MODES, QUESTIONS, compare, run_lm_eval_bench
from ops.settings import Settings


def test_the_local_task_is_100_questions_of_4_choices_answers_spread() -> None:
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    assert len(rows) == 100
    assert all(len(r["choices"]) == 4 and 0 <= r["answer"] < 4 for r in rows)
    assert len({r["question"] for r in rows}) == 100
    assert {sum(r["answer"] == i for r in rows) for i in range(4)} <= set(range(20, 31))


def test_compare_counts_points_changed_answers_and_the_largest_difference() -> None:
    hf = {"lm_eval_acc": 0.5, "lm_eval_acc_norm": 0.5, "loglikelihoods": [[-1.0, -2.0], [-3.0, -2.5]]}
    mode = {"lm_eval_acc": 0.51, "lm_eval_acc_norm": 0.5, "loglikelihoods": [[-2.2, -2.0], [-3.0, -2.4]]}
    got = compare(mode, hf)
    assert got["lm_eval_acc_delta_vs_hf_fp32"] == pytest.approx(1.0)
    assert got["lm_eval_acc_norm_delta_vs_hf_fp32"] == 0.0
    assert got["answers_changed_vs_hf_fp32"] == 1  # the first question's pick moved to choice 1
    assert got["max_abs_loglikelihood_delta"] == pytest.approx(1.2)
    assert "loglikelihoods" not in got


def test_an_unknown_mode_is_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="float32/kv-float32"):
        run_lm_eval_bench(Settings(), modes=["float16/kv-float16"])
    assert len(LM_EVAL_MODES) == 4
