"""A worker's figures as Flower's worker page shows them: flat `kvferry.*` fields of its stats,
each a number or a string with its unit (Flower prints a nested dict as one raw blob)."""

from __future__ import annotations

from typing import Any

from broker.messages import WorkerStatus

MiB = 1024**2


def _mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def flat_fields(status: WorkerStatus) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kvferry.model": status.model,
        "kvferry.queue": status.queue,
        "kvferry.state": status.state if status.healthy else "unhealthy",
        "kvferry.jobs_running": status.jobs_running,
        "kvferry.jobs_done": status.jobs_done,
        "kvferry.jobs_failed": status.jobs_failed,
        "kvferry.concurrency": f"{status.concurrency} jobs, {status.seats} engine seats",
        "kvferry.warm_start": f"{status.warm_start_blocks} blocks ({_mib(status.warm_start_bytes)})",
    }
    e = status.engine
    if e is None:  # still loading its model
        return out
    used = f"{e.pool_blocks_used} / {e.pool_blocks_total} blocks ({_pct(e.kv_usage)})"
    hits = f"{_pct(e.prefix_hit_rate)} of {e.prefix_cache_queries_tokens} prompt tokens"
    out.update(
        {
            "kvferry.kv_pool_used": used,
            "kvferry.kv_pool_cached": f"{e.pool_blocks_cached} blocks (free, holding a prefix)",
            "kvferry.kv_pool_size": f"{_mib(e.pool_bytes)} ({e.bytes_per_block} bytes a block)",
            "kvferry.kv_fragmentation": _pct(e.fragmentation),
            "kvferry.prefix_hit_rate": hits,
            "kvferry.seqs_running": f"{e.num_running} / {e.max_batch_seqs} seqs",
            "kvferry.seqs_waiting": f"{e.num_waiting} seqs",
            "kvferry.preemptions": e.num_preemptions,
            "kvferry.generated_tokens": f"{e.generation_tokens} tokens",
            "kvferry.weights": _mib(e.weights_bytes),
        }
    )
    return out
