"""--find-capacity: the largest number of concurrent sessions whose p95 TTFT and p95 TPOT meet the
SLOs. N doubles from 1 until a level misses (or --max-sessions is reached), then bisects between
the last level met and the first missed. Pure: `search` yields the next N to run and is sent back
whether it met; `find_capacity` drives it with a plain function (the tests' way in)."""

from __future__ import annotations

from collections.abc import Callable, Generator

Search = Generator[int, bool, int]


def search(max_sessions: int) -> Search:
    """Yields each N to try; send whether it met. Returns the largest N met (0 if even 1 missed)."""
    met_n, missed_n, n = 0, 0, 1
    while n <= max_sessions:
        if not (yield n):
            missed_n = n
            break
        met_n = n
        if n == max_sessions:
            return met_n
        n = min(2 * n, max_sessions)
    if not missed_n:
        return met_n
    while missed_n - met_n > 1:
        mid = (met_n + missed_n) // 2
        if (yield mid):
            met_n = mid
        else:
            missed_n = mid
    return met_n


def find_capacity(measure: Callable[[int], bool], max_sessions: int) -> tuple[list[tuple[int, bool]], int]:
    """The levels tried in order as (n, met), and the largest n met."""
    tried: list[tuple[int, bool]] = []
    steps = search(max_sessions)
    try:
        n = next(steps)
        while True:
            ok = measure(n)
            tried.append((n, ok))
            n = steps.send(ok)
    except StopIteration as stop:
        return tried, int(stop.value)
