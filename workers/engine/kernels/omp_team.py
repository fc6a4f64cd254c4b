"""One OpenMP team per worker process: torch's parallel regions run on the engine thread alone.

libgomp (torch's OpenMP runtime on Linux) keeps a pool of threads for each thread that has run a
parallel region. Once the process holds more such threads than CPUs, every team stops spinning
between regions and sleeps on a futex instead, so each of the thousands of regions in a forward
pays a kernel wake-up (docs/benchmarks.md, design measurements). So the engine is built
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
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from _ctypes import CFuncPtr

log = logging.getLogger(__name__)
_local = threading.local()


class _DlInfo(ctypes.Structure):
    _fields_ = (
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    )


def _omp_users() -> tuple[str, ...]:
    """The loaded libraries whose parallel regions torch's ops run: libtorch_cpu, and kvferry's
    kernel library once loaded (torch.ops.load_library records it)."""
    try:
        with open("/proc/self/maps") as maps:
            mapped = {line.split()[-1] for line in maps if "libtorch_cpu" in line}
    except OSError:
        mapped = set()
    users = {p for p in mapped if os.path.basename(p).startswith("libtorch_cpu")}
    return tuple(sorted(users | set(torch.ops.loaded_libraries)))


def runtime_path(fn: CFuncPtr) -> str | None:
    """The file of the loaded library that defines `fn` (dladdr)."""
    dladdr = getattr(ctypes.CDLL(None), "dladdr", None)
    if dladdr is None:
        return None
    info = _DlInfo()
    dladdr.argtypes, dladdr.restype = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)], ctypes.c_int
    if not dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(os.fsdecode(info.dli_fname))


@functools.cache
def _team_size_setters(users: tuple[str, ...]) -> tuple[CFuncPtr, ...]:
    """omp_set_num_threads of the OpenMP runtime each of `users` links, as the dynamic linker
    resolved it for that library (dlsym on its handle searches its own dependencies), once each:
    a process may hold a second libgomp (loaded by path, or under another soname) that torch's
    regions never use, and setting its team size would confine nothing."""
    setters: dict[int | None, CFuncPtr] = {}
    for path in users:
        try:
            fn = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).omp_set_num_threads
        except (OSError, AttributeError):  # gone, or built without OpenMP
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], None
        setters.setdefault(ctypes.cast(fn, ctypes.c_void_p).value, fn)
        log.debug("%s runs its parallel regions on %s", path, runtime_path(fn))
    return tuple(setters.values())


def _set_team_size() -> Callable[[int], None] | None:
    """Sets the team size of this thread in every OpenMP runtime torch's ops run on (never loading
    one); None when none is loaded."""
    setters = _team_size_setters(_omp_users())
    if not setters:
        log.debug("no OpenMP runtime loaded: other threads' torch ops keep their default team size")
        return None

    def set_all(size: int) -> None:
        for fn in setters:
            fn(size)

    return set_all


def confine_to_this_thread() -> None:
    """Run this thread's torch parallel regions on this thread alone (idempotent, per thread)."""
    if getattr(_local, "confined", False):
        return
    _local.confined = True
    torch.get_num_threads()  # torch's own per-thread set-up first: it would size the team again
    set_team_size = _set_team_size()
    if set_team_size is not None:
        set_team_size(1)
