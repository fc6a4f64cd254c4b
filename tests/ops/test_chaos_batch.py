"""`kvferry chaos --batch`: its count by custom_id on its own, then `--batch --quick` as users run
it (a real stack of two workers serving the tiny model; worker SIGKILLs, a Redis restart and an
api SIGKILL while the batch runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.chaos.batch import BatchChaosConfig, count, plan
from ops.chaos.batch_races import add_fanout, fanout_short, holder_pid

ROOT = Path(__file__).resolve().parents[2]


def _line(cid: str, text: str | None) -> dict[str, Any]:
    if text is None:
        return {"custom_id": cid, "response": {"status_code": 400, "body": {"error": {}}}}
    body = {"choices": [{"message": {"content": text}}], "usage": {"completion_tokens": 2}}
    return {"custom_id": cid, "response": {"status_code": 200, "body": body}}


def test_count_finds_lost_duplicated_failed_and_mismatched_lines() -> None:
    reference = {"a": "x", "b": "y", "c": "z", "d": "w"}
    output = [_line("a", "x"), _line("b", "y"), _line("b", "y"), _line("c", "not z")]
    errors = [_line("bad", None), _line("d", None)]
    got = count(output, errors, reference, {"bad"})
    assert got["lines_total"] == 5 and got["lines_completed"] == 3
    assert got["lines_lost"] == 0 and got["lines_duplicated"] == 1 and got["lines_failed"] == 1
    assert got["lines_mismatched"] == 1 and not got["lines_exactly_once"]
    clean = count([_line("a", "x")], [_line("bad", None)], {"a": "x"}, {"bad"})
    assert clean["lines_exactly_once"] and clean["lines_lost"] == clean["lines_mismatched"] == 0
    gone = count([_line("a", "x")], [], {"a": "x", "b": "y"}, {"bad"})
    assert gone["lines_lost"] == 2 and not gone["lines_exactly_once"]


def test_fanout_lines_and_the_lease_holders_pid() -> None:
    bodies = {f"line-{i}": {"max_tokens": 2} for i in range(6)}
    fanned = add_fanout(bodies, {"line-2"}, 2, 4)
    assert fanned == {"line-0", "line-4"} and bodies["line-0"]["n"] == 4 and "n" not in bodies["line-2"]
    full = {"custom_id": "line-0", "response": {"body": {"choices": [{}] * 4}}}
    cut = {"custom_id": "line-4", "response": {"body": {"choices": [{}]}}}
    assert fanout_short([full, cut], fanned, 4) == 1
    assert holder_pid("7|api@host-1:4242") == 4242 and holder_pid("") is None


def test_plan_puts_the_quick_faults_early() -> None:
    config = BatchChaosConfig(kills=4, redis_restarts=1, api_restarts=1)
    assert plan(config) == ["redis", "api", "kill", "kill", "kill", "kill"]
    assert plan(BatchChaosConfig(kills=0, redis_restarts=1, api_restarts=1)) == ["redis", "api"]


def test_chaos_batch_quick_every_line_once(
    tiny_model_dir: Path, kvferry_cache_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "chaos.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KVFERRY_CACHE_DIR": str(kvferry_cache_dir)}
    for name in ("KVFERRY_REDIS_URL", "KVFERRY_KV_REDIS_URL", "KVFERRY_API_KEY"):
        env.pop(name, None)  # the run brings its own Redis
    # few seats (2 a worker, 4 threads): the tiny model's batch outlasts its faults
    env.update(KVFERRY_WORKER_CONCURRENCY="4", KVFERRY_MAX_NUM_SEQS="2", KVFERRY_DISPATCH_HEADROOM="1")
    args = ["chaos", "--batch", "--quick", "--json", str(out), "--run-dir", str(tmp_path / "run")]
    # one worker SIGKILL (the path is the same for each): a second one only restarts a worker
    # while the batch runs on one; 180 lines outlast the faults and the lease race (over 10 s in)
    args += ["--batch-lines", "180", "--max-tokens", "32", "--kills", "1"]
    args += ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--cache-size", "8M"]
    args += ["--torch-threads", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,  # the races add a second api, a 6.5 s pause and a 6.5 s re-read
    )
    print(done.stderr[-3000:], done.stdout, sep="\n")
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = f"{done.stdout[-3000:]}\nlogs: {tmp_path / 'run'}"
    assert result["batch_status"] == "completed", summary
    assert result["lines_exactly_once"] and result["lines_lost"] == 0, summary
    assert result["lines_mismatched"] == 0 and result["lines_failed"] == 0, summary
    assert result["kills"] >= 1 and result["api_restarts"] == 1 and result["redis_restarts"] == 1, summary
    # the races: a second api took the lease from a paused holder; the deleted inputs' batches
    # ended alone (the deletes refused); fan-out lines whole; the output file stable and not empty
    assert result["lease_pauses"] == 1 and result["lease_takeovers"] == 1, summary
    assert result["input_deletes_allowed"] == 0 and result["input_deletes_refused"] == 2, summary
    assert result["side_stuck"] == 0 and result["side_ended_alone"] == 2, summary
    assert result["fanout_lines"] > 0 and result["fanout_short"] == 0, summary
    assert not result["output_empty_after_completed"], summary
    assert not result["output_changed_after_completed"], summary
    assert done.returncode == 0, summary
