"""Helpers for the Batch API tests: an api process with tenants and a files directory, batch files
of greedy completion lines, polling a batch to its end and reading its output files."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from openai import OpenAI

from tests.integration.conftest import MODEL, running_api

KEYS = "key-alice:alice,key-bob:bob"
ENDED = ("completed", "failed", "expired", "cancelled")


def batch_api(redis_url: str, files_dir: Path, log: Path, **settings: str) -> Iterator[str]:
    env = {
        **os.environ,
        "KVFERRY_API_KEYS": KEYS,
        "KVFERRY_FILES_DIR": str(files_dir),
        **{f"KVFERRY_{k.upper()}": v for k, v in settings.items()},
    }
    yield from running_api(["--redis-url", redis_url, "--model", MODEL], env, log)


def client(url: str, key: str = "key-alice") -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def completion_line(custom_id: str, prompt: list[int], max_tokens: int, **body: Any) -> dict[str, Any]:
    payload = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": {**payload, **body}}


def upload(c: OpenAI, lines: list[dict[str, Any] | str]) -> str:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return c.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch").id


def wait_ended(c: OpenAI, batch_id: str, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = c.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status}: {batch.request_counts}")
        time.sleep(0.2)


def read_lines(c: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in c.files.content(file_id).text.splitlines() if line]


class ApiProcess:
    """`kvferry api` as a process this test may SIGKILL (running_api only terminates it)."""

    def __init__(self, redis_url: str, files_dir: Path, log: Path) -> None:
        import subprocess
        import sys

        import httpx

        from ops.redis.server import free_port
        from tests.integration.conftest import ROOT, wait_for

        port = free_port()
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "KVFERRY_API_KEYS": KEYS,
            "KVFERRY_FILES_DIR": str(files_dir),
            # the runner lease of a SIGKILLed api expires this soon: another api takes the batches
            # over then (the default 5 s would only make the test wait)
            "KVFERRY_BATCH_LEASE_TTL_S": "2",
        }
        args = [sys.executable, "-m", "ops.cli.main", "api", "--port", str(port), "--redis-url", redis_url]
        self.process = subprocess.Popen(
            [*args, "--model", MODEL], cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
        )
        self.url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"api exited:\n{log.read_text()[-3000:]}")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 30, "the api")

    def kill(self) -> None:
        import signal

        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
