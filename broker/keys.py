"""Every queue name and Redis key format kvferry uses, defined here and nowhere else."""

from __future__ import annotations

PREFIX = "kvferry"
SHARED_QUEUE = "kvferry.shared"
GENERATE_TASK = "kvferry.generate"  # public API: producers may send_task() it by name

# kombu's Redis transport keeps unacknowledged messages here (its defaults; see broker/celery_app.py).
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"


def worker_queue(worker_name: str) -> str:
    """The queue only this worker consumes (a session's turns are routed to it)."""
    return f"{PREFIX}.worker.{worker_name}"


def job_stream(job_id: str) -> str:
    """Redis stream of a job's events (token deltas, then done or error)."""
    return f"{PREFIX}:job:{job_id}:events"


def job_meta(job_id: str) -> str:
    """Hash: what the api knew when it queued the job (model, queue, route reason, times)."""
    return f"{PREFIX}:job:{job_id}:meta"


def job_cancel(job_id: str) -> str:
    """Set when a client cancels a job; the worker running it stops at its next token."""
    return f"{PREFIX}:job:{job_id}:cancel"


def worker_heartbeat(worker_name: str) -> str:
    """Hash with a TTL: a live worker's load and pool figures; gone means the worker is dead."""
    return f"{PREFIX}:worker:{worker_name}:heartbeat"


def worker_jobs(worker_name: str) -> str:
    """Set of the job ids a worker is running now (to hand back if it dies)."""
    return f"{PREFIX}:worker:{worker_name}:jobs"


WORKERS = f"{PREFIX}:workers"  # set of every worker name that has ever announced itself
REAPER_LOCK = f"{PREFIX}:reaper:lock"


def session(session_id: str) -> str:
    """The session's record (JSON of broker.messages.SessionRecord)."""
    return f"{PREFIX}:session:{session_id}"


SESSION_EXPIRY = f"{PREFIX}:sessions:expiry"  # ZSET session id -> when it expires (pins are released then)


def worker_prefixes(worker_name: str) -> str:
    """ZSET of the prompt-prefix digests a worker served recently (score: last use), for routing."""
    return f"{PREFIX}:worker:{worker_name}:prefixes"
