"""Remote control a worker answers. Prefetch hints (a Redis list per worker, drained by
workers/tiers/prefetch.py's HintListener) and Celery broadcast commands, for `kvferry chaos`:
`kvferry_integrity` checks the engine's KV pool invariants between two steps and says how it went;
`kvferry_drain` (`kvferry worker --drain`) makes the worker drain and exit (workers/process/drain.py).

    app.control.broadcast("kvferry_integrity", reply=True, timeout=10)
    -> [{"w1@host": {"ok": True, "error": ""}}, ...]
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import WorkerShutdown
from celery.worker.control import control_command

from workers.jobs.engine_service import EngineService
from workers.process.drain import Drain
from workers.tiers.prefetch import HintListener

INTEGRITY_TIMEOUT_S = 30.0


def check_integrity(service: EngineService) -> dict[str, Any]:
    loop = service.current_loop  # never builds the engine: an unbuilt one has nothing to check
    if loop is None:
        return {"ok": False, "error": "the engine is not built"}
    try:
        loop.check_integrity(timeout=INTEGRITY_TIMEOUT_S)
    except Exception as exc:  # an AssertionError is the finding; anything else, why we could not look
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "error": ""}


def register_control(service: EngineService, drain: Drain | None = None) -> HintListener:
    """Register the commands for this process's one worker (Celery's registry is per process),
    and start draining its prefetch hints (api/routing/router.py sends them; see
    workers/tiers/prefetch.py)."""
    hints = HintListener(service.redis, service.identity.name, service.prefetch, service.can_prefetch)
    hints.start()

    @control_command(name="kvferry_integrity")
    def kvferry_integrity(state: Any) -> dict[str, Any]:
        return check_integrity(service)

    @control_command(name="kvferry_drain")
    def kvferry_drain(state: Any) -> dict[str, Any]:
        if drain is None:
            return {"ok": False, "error": "this worker cannot drain"}
        drain.begin("kvferry worker --drain")
        raise WorkerShutdown(0)  # Celery's warm shutdown, as its own `shutdown` command does

    return hints
