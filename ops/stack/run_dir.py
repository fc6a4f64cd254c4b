"""A benchmark's folder for the stacks it starts: temporary, and gone when the benchmark ends; when
it fails, the processes' logs are kept first (a stack's api, workers and Redis servers write theirs
there, and a benchmark's traceback alone says only that a connection dropped)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def stack_run_dir(prefix: str, keep_under: Path) -> Iterator[Path]:
    """A temporary folder; on an exception, its `*.log` files are copied (with their relative
    paths) to a new folder under `keep_under` first, and the exception says where. Redis's data
    files are not kept: they hold the prompts."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        run_dir = Path(tmp)
        try:
            yield run_dir
        except BaseException as e:
            kept = keep_logs(run_dir, keep_under / f"{prefix}{time.strftime('%Y%m%dT%H%M%S')}")
            if kept is not None:
                e.add_note(f"the stacks' logs are kept in {kept}")
            raise


def keep_logs(run_dir: Path, to: Path) -> Path | None:
    """Copy the `*.log` files under `run_dir` to `to` (made private); None when there are none."""
    logs = sorted(run_dir.rglob("*.log"))
    if not logs:
        return None
    to.mkdir(parents=True, mode=0o700)
    for log in logs:
        target = to / log.relative_to(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, target)
    return to
