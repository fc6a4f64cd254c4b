"""`kvferry chaos`: its checks on their own, then `kvferry chaos --quick` as users run it (a real
stack of two workers serving the tiny model, SIGKILLs and a Redis restart)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ops.chaos.check import check_job, recomputed_tokens, stream_diff
from ops.chaos.clients import JobRecord, make_scripts
from ops.chaos.faults import FaultInjector, node_of

ROOT = Path(__file__).resolve().parents[2]
KEYS = (
    "jobs",
    "completed",
    "exact",
    "duplicated_tokens",
    "missing_tokens",
    "lost",
    "not_submitted",
    "kills",
    "redis_restarts",
    "redelivery_p50_s",
    "redelivery_max_s",
    "recomputed_tokens",
    "duration_s",
)


def _record(key: str, chunks: list[str], complete: bool = True, status: str = "completed") -> JobRecord:
    record = JobRecord(key, job_id=f"id-{key}", status=status, stream_complete=complete)
    at = 0
    for n, text in enumerate(chunks):
        record.chunks.append((float(n), at, text))
        at += len(text)
    record.text = record.streamed if complete else "".join(chunks)
    record.usage = {"completion_tokens": len(chunks)}
    return record


def test_stream_diff_counts_repeats_and_gaps() -> None:
    assert stream_diff("abcdef", "abcdef", True) == (0, 0)
    assert stream_diff("abcdef", "abcdcdef", True) == (2, 0)
    assert stream_diff("abcdef", "abef", True) == (0, 2)
    assert stream_diff("abcdef", "abc", False) == (0, 0)  # broke off: the tail came from polling
    assert stream_diff("abcdef", "abc", True) == (0, 3)


def test_check_job_exact_duplicated_and_wrong() -> None:
    reference = _record("k", ["aa", "bb", "cc"])
    assert check_job(_record("k", ["aa", "bb", "cc"]), reference).exact
    repeated = _record("k", ["aa", "bb", "bb", "cc"])
    repeated.text = "aabbcc"  # the final answer is right, its stream showed a token twice
    check = check_job(repeated, reference)
    assert not check.exact and check.duplicated_tokens == 1 and check.missing_tokens == 0
    assert not check_job(_record("k", ["aa", "xx", "cc"]), reference).exact
    lost = _record("k", ["aa"], complete=False, status="lost")
    assert not check_job(lost, reference).completed
    assert check_job(_record("k", ["aa"]), None).why == "no reference answer"


def test_workload_is_seeded_and_faults_are_planned() -> None:
    assert make_scripts(2, 2, 3, 4, seed=1) == make_scripts(2, 2, 3, 4, seed=1)
    assert make_scripts(2, 2, 3, 4, seed=1) != make_scripts(2, 2, 3, 4, seed=2)
    assert [len(s.prompts) for s in make_scripts(1, 1, 3, 4, 0)[0]] == [3, 1, 1]
    assert FaultInjector._plan(2, 1) == ["kill", "redis", "kill"]
    assert FaultInjector._plan(20, 1).count("redis") == 1 and FaultInjector._plan(20, 1)[0] == "kill"
    spread = FaultInjector._plan(9, 0, failover=3)
    assert (
        spread.count("failover") == 3 and spread[0] == "kill" and "failover failover" not in " ".join(spread)
    )
    assert node_of(["python", "-m", "ops.cli.main", "worker", "--name", "w2", "--preload"]) == "w2"


def test_recomputed_tokens_found_under_any_key() -> None:
    assert recomputed_tokens({"completion_tokens": 3}) is None
    assert recomputed_tokens({"kv_sources": {"recomputed": 4}}) == 4
    assert recomputed_tokens({"recomputed_tokens": 2}) == 2


def test_chaos_quick_loses_and_repeats_nothing(
    tiny_model_dir: Path, kvferry_cache_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "chaos.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KVFERRY_CACHE_DIR": str(kvferry_cache_dir)}
    for name in ("KVFERRY_REDIS_URL", "KVFERRY_KV_REDIS_URL", "KVFERRY_API_KEY"):
        env.pop(name, None)  # the run brings its own Redis
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ops.cli.main",
            "chaos",
            "--quick",
            "--json",
            str(out),
            "--run-dir",
            str(tmp_path / "run"),
            "--model",
            str(tiny_model_dir),
            "--served-model-name",
            "tiny",
            "--cache-size",
            "8M",
            "--torch-threads",
            "1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(done.stderr[-2000:], done.stdout, sep="\n")  # the run's table, shown with -s
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert all(key in result for key in KEYS), result
    summary = f"{done.stdout[-4000:]}\nlogs: {tmp_path / 'run'}"
    assert result["kills"] >= 2 and result["redis_restarts"] == 1, summary
    assert result["lost"] == 0, summary
    assert result["duplicated_tokens"] == 0 and result["missing_tokens"] == 0, summary
    assert result["jobs"] > 0 and result["exact"] == result["completed"] == result["jobs"], summary
    # a Redis restart once ended every worker process; a resumed job once failed its whole step
    assert not result["unexpected_exits"] and result["engine_step_failures"] == 0, summary
    assert done.returncode == 0, summary
