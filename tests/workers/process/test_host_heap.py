"""workers/process/host_heap.py: with the host heap kept and reserved, receiving ~60 MB of 1.4 MB values
(a Redis read's packs) touches no fresh page, from the first read on. Each case runs in a process
of its own: mallopt changes the whole process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_READS = """
import json, resource, sys
from workers.process.host_heap import keep_freed_memory
applied = keep_freed_memory(int(sys.argv[1]))
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    values = [bytes(bytearray(1_474_560)) for _ in range(40)]  # a fetch's packs, ~59 MB
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del values
print(json.dumps({"applied": applied, "faults": faults}))
"""
PAGES = 40 * 1_474_560 // 4096  # a read's pages, ~14,400


def _reads(reserve_bytes: int) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _READS, str(reserve_bytes)], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_reads_touch_no_fresh_page_with_the_heap_kept() -> None:
    kept = _reads(256 * 1024**2)
    assert kept["applied"] is True
    faults = kept["faults"]
    assert isinstance(faults, list)
    # without the reserve, every read faults about all its pages in again
    assert all(f < PAGES // 20 for f in faults), faults


def test_no_reserve_changes_nothing() -> None:
    assert _reads(0)["applied"] is False
