"""The Celery app: Redis broker and result backend, JSON only, late acks, one queue per worker."""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery
from kombu import Exchange, Queue

from broker import keys
from broker.defaults import DEFAULTS
from broker.priority import PRIORITY_STEPS
from broker.redis import connect as redis_connect
from broker.redis import transport as redis_transport
from broker.redis.result_backend import send_only_url


def heartbeat_interval_for(ttl_s: float) -> float:
    """Four beats per TTL: a worker must miss several in a row to be taken for dead."""
    return max(0.25, ttl_s / 4)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    redis_url: str = DEFAULTS.redis_url  # or a Sentinel address (broker/redis/connect.py)
    job_time_limit_s: int = DEFAULTS.job_time_limit_s  # the longest a job may run
    result_ttl_s: int = DEFAULTS.job_ttl_s
    # Redelivery of a dead worker's jobs: its heartbeat expires after heartbeat_ttl_s, a live
    # worker's reaper then makes its unacked messages visible, and kombu's sweep (every
    # restore_interval_s) puts them back on their queue. The visibility timeout is only the
    # backstop for messages no reaper saw, so it is longer than any job may run.
    heartbeat_interval_s: float = heartbeat_interval_for(DEFAULTS.heartbeat_ttl_s)
    heartbeat_ttl_s: int = DEFAULTS.heartbeat_ttl_s
    # kombu's own sweep of messages unacked past the visibility timeout, run by every worker: the
    # reaper and the orphan sweep (one elected worker) hand jobs back themselves, so this is the
    # backstop only, and a short period would cost Redis a mutex and a scan per worker per period.
    restore_interval_s: int = 60
    # A running job's lease (broker/jobs/lease.py) lapses this long after its worker stopped
    # renewing it (every heartbeat interval, from a thread of its own); None: heartbeat_ttl_s.
    # Shorter is faster redelivery after a death; longer tolerates longer stalls of a live worker
    # (a stall past it costs a duplicate attempt, never a duplicate token: writes are fenced).
    job_lease_ttl_s: float | None = None

    @property
    def lease_ttl_s(self) -> float:
        return self.job_lease_ttl_s if self.job_lease_ttl_s is not None else float(self.heartbeat_ttl_s)

    @property
    def visibility_timeout_s(self) -> int:
        return 2 * self.job_time_limit_s


def queue(name: str) -> Queue:
    """Each queue has its own direct exchange and routing key: a message lands in one queue only."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def make_celery(config: BrokerConfig, name: str = "kvferry", send_only: bool = False) -> Celery:
    """send_only: for a process that sends jobs and never waits on Celery's results (the api):
    sending then subscribes to nothing (broker/redis/result_backend.py). The broker's Redis transport
    is kombu's, fixed so that a Redis restart does not end a worker (broker/redis/transport.py)."""
    redis_transport.install()
    url = redis_connect.celery_url(config.redis_url)  # under Sentinel: kombu's sentinel:// list
    sentinel = redis_connect.transport_options(config.redis_url)  # {} without Sentinel
    backend = send_only_url(url) if send_only else url
    app = Celery(name, broker=url, backend=backend)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],  # never pickle: nothing that crosses a process is executable
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        # No STARTED state in the result backend: its write costs every job a Redis round trip
        # between pickup and start (docs/benchmarks.md). Who runs a job is its lease's owner
        # (api/jobs/view.py); Flower, once it has enabled task events, shows task-started from the
        # worker's events.
        task_track_started=False,
        task_time_limit=config.job_time_limit_s,
        result_expires=config.result_ttl_s,
        result_extended=False,  # never keep prompts (task args) in the result backend
        task_default_queue=keys.SHARED_QUEUE,
        task_queues=[queue(keys.SHARED_QUEUE)],
        task_default_exchange=keys.SHARED_QUEUE,
        task_default_routing_key=keys.SHARED_QUEUE,
        task_create_missing_queues=True,
        broker_connection_retry_on_startup=True,
        # Celery's default: no task events until a monitor asks. Flower does, every few seconds
        # (its enable_events), and lists the jobs from then on. Each job's three events cost the
        # worker's consumer thread Redis publishes and the GIL, time a short job's latency pays
        # (docs/benchmarks.md). Worker events (heartbeats) always go out.
        worker_send_task_events=False,
        # No task-sent event: it costs the producer a publish of its own for every job
        # (docs/benchmarks.md), and Flower, once it has enabled task events, shows every task from
        # the task-received on.
        task_send_sent_event=False,
        worker_enable_remote_control=True,
        # Not worker_cancel_long_running_tasks_on_connection_loss: the threads pool cannot stop a
        # running thread anyway, and with kombu's Redis transport that setting makes the worker
        # exit on a Redis restart (celery/celery#9250). The job lease does its work: a job runs
        # under one epoch at a time, and a copy delivered after a lost connection waits for it.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_transport_options={
            "visibility_timeout": config.visibility_timeout_s,
            "unacked_restore_interval": config.restore_interval_s,
            "unacked_restore_throttle": 1,
            "unacked_mutex_expire": 60,
            # One list per band of each queue, BRPOPed band-major across all of a worker's queues
            # (broker/priority.py); queue_order_strategy stays kombu's default.
            "priority_steps": list(PRIORITY_STEPS),
            **sentinel,
        },
        result_backend_transport_options={"visibility_timeout": config.visibility_timeout_s, **sentinel},
    )
    return app
