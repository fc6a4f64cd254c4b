"""One OpenMP team per worker process: torch's parallel regions run on the engine thread alone.

libgomp (torch's OpenMP runtime on Linux) keeps a pool of threads for each thread that has run a
parallel region. Once the process holds more such threads than CPUs, every team stops spinning
between regions and sleeps on a futex instead, so each of the thousands of regions in a forward
pays a kernel wake-up. Measured on 2 cores: a cached 1,300-token prompt took 94 ms on an engine
thread beside the model-loading thread's pool, and 72 ms with no other pool. So the engine is built
and run on its loop's own thread (EngineLoop.build), and any other thread that runs torch ops (the
KV writer, prefetches decoding lossy tier blocks) first calls ``confine_to_this_thread()``: its
regions then run on the calling thread alone and start no pool.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)
_local = threading.local()


@functools.cache
def _set_team_size() -> Callable[[int], None] | None:
    """libgomp's omp_set_num_threads, from the copy torch loaded (never a second copy); None when
    this process runs another OpenMP runtime, or none."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        fn = lib.omp_set_num_threads
        fn.argtypes, fn.restype = [ctypes.c_int], None
        return fn
    log.debug("no libgomp loaded: other threads' torch ops keep their default team size")
    return None


def confine_to_this_thread() -> None:
    """Run this thread's torch parallel regions on this thread alone (idempotent, per thread)."""
    if getattr(_local, "confined", False):
        return
    _local.confined = True
    torch.get_num_threads()  # torch's own per-thread set-up first: it would size the team again
    set_team_size = _set_team_size()
    if set_team_size is not None:
        set_team_size(1)
