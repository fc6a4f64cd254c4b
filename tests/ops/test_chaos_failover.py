"""`kvferry chaos --failovers --kv-shard-kills`: the queue's primary SIGKILLed under Sentinel and a
KV shard SIGKILLed during the load; no accepted job is lost, every job is exact, the raw streams
hold each token once, and the report says how long recovery took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import ROOT

HA_KEYS = ("failovers", "promotion_p50_s", "recovery_p50_s", "recovery_max_s", "accepted_lost")
FAULT_KEYS = (*HA_KEYS, "kv_shard_kills", "raw_duplicated_tokens", "raw_duplicated_finals")


def test_chaos_failovers_lose_no_accepted_job(
    tiny_model_dir: Path, kvferry_cache_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "chaos.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KVFERRY_CACHE_DIR": str(kvferry_cache_dir)}
    for name in ("KVFERRY_REDIS_URL", "KVFERRY_KV_REDIS_URL", "KVFERRY_API_KEY", "KVFERRY_REDIS_SENTINELS"):
        env.pop(name, None)  # the run brings its own Redis
    args = ["chaos", "--quick", "--failovers", "2", "--kv-shard-kills", "1", "--kills", "0"]
    args += ["--redis-restarts", "0", "--workers", "1"]
    args += ["--json", str(out), "--run-dir", str(tmp_path / "run"), "--model", str(tiny_model_dir)]
    args += ["--served-model-name", "tiny", "--cache-size", "8M", "--torch-threads", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(done.stderr[-2000:], done.stdout, sep="\n")
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = f"{done.stdout[-4000:]}\nlogs: {tmp_path / 'run'}"
    assert all(key in result for key in FAULT_KEYS), result
    assert result["kv_shard_kills"] == 1, summary
    assert result["raw_duplicated_tokens"] == result["raw_duplicated_finals"] == 0, summary
    assert result["raw_streams_read"] == result["jobs"], summary
    assert result["failovers"] == 2 and result["accepted_lost"] == 0 and result["lost"] == 0, summary
    assert result["jobs"] > 0 and result["exact"] == result["completed"] == result["jobs"], summary
    assert result["duplicated_tokens"] == result["missing_tokens"] == 0, summary
    assert result["recovery_p50_s"] is not None and result["recovery_p50_s"] <= 10, summary
    assert not result["unexpected_exits"] and done.returncode == 0, summary
