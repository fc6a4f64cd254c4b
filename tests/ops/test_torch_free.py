"""The HTTP edge and the light CLI commands never import torch or transformers (start-up time and
memory they do not need). Each check runs in a fresh interpreter: this one has torch loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.redis.server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")

# Runs each light command's real body through the CLI, with what would block (serving HTTP,
# following a job, starting a stack) replaced by a stub that stops right there, and prints which
# heavy modules were loaded after each one.
_COMMANDS = r"""
import json, sys
import uvicorn
import ops.queue_client, ops.stack.stack
from ops.cli.main import main

class Stop(Exception):
    pass

def stop(*args, **kwargs):
    raise Stop

uvicorn.run = lambda app, **kw: None  # `kvferry api` builds the app, then would serve it
ops.queue_client.submit_and_follow = stop
ops.queue_client.preload = stop
ops.stack.stack.Stack = stop
url, templates = sys.argv[1], sys.argv[2]
runs = {
    "help": ["--help"],
    **{f"{c} --help": [*c.split(), "--help"] for c in (
        "api", "ping", "submit", "stats", "preload", "serve", "worker", "run-batch",
        "bench engine", "bench gemm", "bench queue", "bench tiers", "bench serve", "chaos")},
    "api": ["api", "--redis-url", url],
    "ping": ["ping", "--redis-url", url, "--timeout", "0.2"],
    "stats": ["stats", "--json", "--redis-url", url],
    "submit": ["submit", "hello", "--redis-url", url],
    "preload": ["preload", templates, "--redis-url", url],
    "serve": ["serve", "--workers", "0"],
}
loaded = {}
for name, argv in runs.items():
    try:
        main(argv, standalone_mode=False)
    except (SystemExit, Stop):
        pass
    loaded[name] = [m for m in ("torch", "transformers") if m in sys.modules]
print(json.dumps(loaded))
"""


def _fresh(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _loaded_after(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    loaded: list[str] = json.loads(_fresh(code))
    return loaded


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


def test_the_api_app_is_torch_free() -> None:
    loaded = _loaded_after("api.app")
    assert not [m for m in HEAVY if m in loaded]


@pytest.mark.parametrize(
    "module", ["ops.cli.main", "ops.stack.api_server", "ops.queue_client", "ops.stack.stack"]
)
def test_cli_modules_are_torch_free(module: str) -> None:
    loaded = _loaded_after(module)
    assert not [m for m in HEAVY if m in loaded]


def test_settings_load_no_service_library() -> None:
    """Every process reads its settings first; that alone loads pydantic and nothing of ours
    beyond the defaults."""
    loaded = _loaded_after("ops.settings")
    assert not [m for m in (*HEAVY, "celery", "fastapi", "redis", "workers.engine") if m in loaded]


def test_light_commands_run_without_torch(redis_url: str, tmp_path: Path) -> None:
    templates = tmp_path / "templates.txt"
    templates.write_text("You are a helpful assistant.\n")
    loaded = json.loads(_fresh(_COMMANDS, redis_url, str(templates)))
    assert {name: heavy for name, heavy in loaded.items() if heavy} == {}
    assert "api" in loaded and "submit" in loaded  # every run reached the end
