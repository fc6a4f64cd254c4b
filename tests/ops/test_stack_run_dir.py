"""A benchmark's stack folder: gone at the end; on a failure its logs (not Redis's data) are kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.stack.run_dir import stack_run_dir


def _fill(run_dir: Path) -> None:
    (run_dir / "cache-aware-0" / "redis" / "appendonlydir").mkdir(parents=True)
    (run_dir / "cache-aware-0" / "api.log").write_text("Traceback: the api\n")
    (run_dir / "cache-aware-0" / "redis" / "redis.log").write_text("redis started\n")
    (run_dir / "cache-aware-0" / "redis" / "appendonlydir" / "a.aof").write_text("a prompt\n")


def test_a_failed_benchmark_keeps_its_stacks_logs_and_says_where(tmp_path: Path) -> None:
    keep = tmp_path / "bench-logs"
    with pytest.raises(ConnectionError) as failed, stack_run_dir("kvferry-t-", keep) as run_dir:
        _fill(run_dir)
        raise ConnectionError("the api dropped the stream")
    assert not run_dir.exists()
    (kept,) = keep.iterdir()
    assert (kept / "cache-aware-0" / "api.log").read_text() == "Traceback: the api\n"
    assert (kept / "cache-aware-0" / "redis" / "redis.log").exists()
    assert not list(kept.rglob("*.aof")), "Redis's data holds prompts: not kept"
    assert kept.stat().st_mode & 0o077 == 0
    assert failed.value.__notes__ == [f"the stacks' logs are kept in {kept}"]


def test_a_benchmark_that_ends_well_keeps_nothing(tmp_path: Path) -> None:
    keep = tmp_path / "bench-logs"
    with stack_run_dir("kvferry-t-", keep) as run_dir:
        _fill(run_dir)
    assert not run_dir.exists()
    assert not keep.exists()
