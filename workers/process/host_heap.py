"""The worker's host heap: glibc's malloc told to keep what it frees, and a reserve faulted in at
start-up, so the packs a Redis read receives (and the engine's activations) land in memory the
process already touched instead of fresh pages.

Why: a 2,048-token resume receives ~94 MB of packs. With glibc's defaults each fetch gets fresh
pages from the kernel (large allocations are mmapped, and freed memory is handed back): a
first-touch page fault for every page it receives, and on a VM, where a fault is dear, those
faults make up much of the fetch's time. With the heap kept and reserved it faults no page in
(docs/benchmarks.md; `kvferry bench tiers`: each resume row prints its faults and kernel time).

The settings (mallopt): one arena, so every thread (the job threads that fetch, the fetch helper,
the writer) allocates from the heap the reserve faulted in; a fixed mmap threshold of 32 MiB, so
packs and activations come from that heap (the pool and the weights, larger, are still mapped);
and a top pad of the reserve, so a trim of the heap always leaves that much mapped. The cost is
the reserve's resident memory, held whether used or not, and a heap that shrinks back only to it.
Not glibc (musl, macOS) or a preloaded allocator (jemalloc, tcmalloc): nothing is changed."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 * 1024**2  # the largest every 64-bit glibc accepts (HEAP_MAX_SIZE / 2)
_CHUNK = 4 * 1024**2
_INT_MAX = 2**31 - 1


def keep_freed_memory(reserve_bytes: int) -> bool:
    """Apply the settings and fault the reserve in; False (nothing changed) when the C library is
    not glibc or `reserve_bytes` is 0."""
    if reserve_bytes <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, malloc, free = libc.mallopt, libc.malloc, libc.free
        in_use = ctypes.CDLL(None).malloc  # jemalloc or tcmalloc, when one is preloaded
    except (OSError, AttributeError):
        return False
    if ctypes.cast(in_use, ctypes.c_void_p).value != ctypes.cast(malloc, ctypes.c_void_p).value:
        log.info("malloc is not libc's (a preloaded allocator): the host heap is left to it")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    pad = min(reserve_bytes, _INT_MAX)
    trim = min(2 * pad + MMAP_THRESHOLD, _INT_MAX)
    # the arena last: a refusal before it leaves the process as it was (glibc only refuses bad values)
    wanted = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (M_TOP_PAD, pad),
        (M_TRIM_THRESHOLD, trim),
        (M_ARENA_MAX, 1),
    )
    for param, value in wanted:
        if not mallopt(param, value):
            log.warning(
                "mallopt refused %d=%d: the host heap is only partly set up, no reserve", param, value
            )
            return False
    chunks = [malloc(_CHUNK) for _ in range(max(1, reserve_bytes // _CHUNK))]
    for chunk in chunks:
        if chunk:
            ctypes.memset(chunk, 0, _CHUNK)  # the first touch, now rather than on the read path
    for chunk in chunks:
        free(chunk)  # back to the heap, which keeps it (the trim threshold)
    return True
