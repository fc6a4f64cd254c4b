"""`kvferry batch submit|status|wait` end to end, as processes, against a real stack (redis-server,
a real worker, `kvferry api` as a process with a files directory): the output file holds every
custom_id once, each answer equal to the same request sent to the online endpoint (greedy), and
the bad line is in the error file. Needs the Batch API routes (api/routes/batches.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ops.redis.server import RedisServer
from tests.integration.conftest import MODEL, ROOT, WorkerProcess, running_api

pytest.importorskip("api.routes.batches", reason="needs the Batch API routes (helper D's branch)")

PROMPTS = [[101, 2000 + i, 3000 + 7 * i, 4000, 42] for i in range(4)]


@pytest.fixture
def api(
    redis_server: RedisServer, worker_factory: Callable[..., WorkerProcess], tmp_path: Path, files_dir: Path
) -> Iterator[str]:
    worker_factory("wcli")
    env = {**os.environ, "KVFERRY_FILES_DIR": str(files_dir)}
    yield from running_api(["--redis-url", redis_server.url, "--model", MODEL], env, tmp_path / "api.log")


def kvferry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli.main", *args], cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def body(prompt: list[int]) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}


def test_submit_status_wait(api: str, tmp_path: Path) -> None:
    lines = [
        json.dumps({"custom_id": f"c-{i}", "method": "POST", "url": "/v1/completions", "body": body(p)})
        for i, p in enumerate(PROMPTS)
    ]
    lines.append(json.dumps({"custom_id": "bad", "method": "POST", "url": "/v1/completions", "body": {}}))
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(lines) + "\n")

    submitted = kvferry(
        "batch",
        "submit",
        str(requests),
        "--endpoint",
        "/v1/completions",
        "--metadata",
        "suite=cli",
        "--url",
        api,
    )
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    assert batch_id.startswith("batch_")
    status = kvferry("batch", "status", batch_id, "--url", api)
    assert status.returncode == 0 and status.stdout.startswith(f"{batch_id}: "), status.stderr

    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    waited = kvferry(
        "batch", "wait", batch_id, "-o", str(out), "--errors", str(err), "--poll", "0.2", "--url", api
    )
    assert waited.returncode == 0, waited.stderr
    assert "completed (4 completed, 1 failed of 5)" in waited.stderr

    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in got) == [f"c-{i}" for i in range(len(PROMPTS))]
    for line in got:
        assert line["error"] is None and line["response"]["status_code"] == 200
        prompt = PROMPTS[int(line["custom_id"].removeprefix("c-"))]
        want = httpx.post(f"{api}/v1/completions", json=body(prompt), timeout=60).json()["choices"][0]["text"]
        assert line["response"]["body"]["choices"][0]["text"] == want
    errors = [json.loads(line) for line in err.read_text().splitlines()]
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert errors[0]["response"]["status_code"] == 400

    described = json.loads(kvferry("batch", "status", batch_id, "--json", "--url", api).stdout)
    assert described["status"] == "completed" and described["metadata"] == {"suite": "cli"}
    assert described["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
