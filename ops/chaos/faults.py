"""The faults of `kvferry chaos`: SIGKILL a random worker (mid-job when one is busy) and start it
again under the same name, K times; restart the queue's Redis; under Sentinel (`serve --ha`),
SIGKILL the queue's primary (Sentinel promotes the replica, the old primary comes back as its
replica); SIGKILL the api and start it again; all on one thread, while the load runs. Every wait
is bounded; the kill times are time.monotonic(), the clients' clock. A new kind of fault is a name
in the plan and a method in FaultInjector.actions (e.g. a KV shard kill)."""

from __future__ import annotations

import logging
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import psutil
import redis

from broker import keys
from broker.messages import WorkerStatus
from broker.redis.connect import connect
from broker.worker_registry import live_workers
from ops.chaos.fault_log import FailoverEvent, FaultLog, KillEvent, KvShardKill
from ops.stack.stack import Stack

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 120.0  # a restarted worker loads its model again
DRAIN_WAIT_S = 120.0  # a SIGTERMed worker's drain (its --drain-timeout, 60 s by default) and exit
KV_SHARD_DOWN_S = (2.0, 5.0)  # a killed KV shard stays down this long, the load running
BUSY_WAIT_S = 5.0  # a kill waits this long at most for a worker that is running a job


def node_of(process_args: list[str]) -> str | None:
    """The --name a `kvferry worker` child was started with: its node is NAME@host."""
    if "--name" in process_args:
        return process_args[process_args.index("--name") + 1]
    return None


class FaultInjector:
    def __init__(
        self,
        stack: Stack,
        kills: int,
        redis_restarts: int,
        rng: random.Random,
        gap_s: tuple[float, float],
        deadline: float,
        say: Callable[[str], object] = lambda line: None,
        failovers: int = 0,
        kv_shard_kills: int = 0,
        api_restarts: int = 0,
        scale_ins: int = 0,
    ) -> None:
        self.say = say
        self.stack = stack
        self.plan = self._plan(
            kills,
            redis_restarts,
            failover=failovers,
            kv_shard=kv_shard_kills,
            api=api_restarts,
            scale_in=scale_ins,
        )
        self.actions: dict[str, Callable[[], None]] = {
            "kill": self._kill,
            "redis": self._restart_redis,
            "failover": self._failover,
            "kv_shard": self._kill_kv_shard,
            "api": self._restart_api,
            "scale_in": self._scale_in,
        }
        self.rng = rng
        self.gap_s = gap_s
        self.deadline = deadline
        self.log = FaultLog()
        self.done = threading.Event()
        self.redis = connect(stack.settings.queue_url, socket_timeout=5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvferry-chaos-faults", daemon=True)

    @staticmethod
    def _plan(kills: int, restarts: int = 0, **others: int) -> list[str]:
        """Redis restarts, then each other kind of fault (by its name in `actions`), spread
        evenly among the kills (not first: the load must be running)."""
        plan = ["kill"] * kills
        for action, count in {"redis": restarts, **others}.items():
            slots = len(plan)
            for n in range(count):
                plan.insert(min(len(plan), (n + 1) * (slots + 1) // (count + 1) + n), action)
        return plan

    @property
    def workers(self) -> list[str]:
        return sorted(name for name in self.stack.children if name.startswith("worker"))

    def start(self) -> FaultInjector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(READY_TIMEOUT_S + 30)

    def _run(self) -> None:
        try:
            for action in self.plan:
                if self._stop.is_set() or time.monotonic() > self.deadline:
                    self.log.notes.append(f"stopped with {action!r} and more still planned")
                    break
                self._wait_all_ready()
                self._stop.wait(self.rng.uniform(*self.gap_s))
                self.actions[action]()
            self._wait_all_ready()
        except Exception as exc:  # a broken fault thread must not hang the run
            log.exception("fault injection failed")
            self.log.notes.append(f"fault injection failed: {type(exc).__name__}: {exc}")
        finally:
            self.done.set()

    def _node(self, child: str) -> str:
        """Its Celery node name (as workers/process/main.py makes it: same host as ours)."""
        args = self.stack.children[child].args
        name = node_of([str(a) for a in args]) if isinstance(args, list) else None
        return f"{name or child}@{socket.gethostname()}"

    def _live(self) -> list[WorkerStatus]:
        try:
            return list(live_workers(self.redis))
        except redis.RedisError:
            return []

    def _busy(self, node: str) -> tuple[str, ...]:
        try:
            return tuple(sorted(j.decode() for j in self.redis.smembers(keys.worker_jobs(node))))  # type: ignore[union-attr]
        except redis.RedisError:
            return ()

    def _kill(self) -> None:
        children = self.workers
        nodes = {c: self._node(c) for c in children}
        end = time.monotonic() + BUSY_WAIT_S
        busy = [c for c in children if self._busy(nodes[c])]
        while not busy and time.monotonic() < end and not self._stop.is_set():
            time.sleep(0.02)  # kill mid-job: that is what redelivery is for
            busy = [c for c in children if self._busy(nodes[c])]
        child = self.rng.choice(busy or children)
        jobs = self._busy(nodes[child])
        at = time.monotonic()
        sent_at = time.time()
        self.stack.restart_child(child)
        self.say(self.log.event(f"SIGKILL {nodes[child]} running {len(jobs)} job(s); restarted"))
        back = self._wait_ready(nodes[child], sent_at)
        self.say(self.log.event(f"{nodes[child]} ready again after {back - at:.1f}s"))
        self.log.kills.append(KillEvent(at, child, nodes[child], jobs, back - at))

    def _scale_in(self) -> None:
        """SIGTERM a busy worker, as a scale-in does: it drains and exits 0; then it is started
        again under its name (the fleet keeps its size for the rest of the run)."""
        children = self.workers
        nodes = {c: self._node(c) for c in children}
        busy = [c for c in children if self._busy(nodes[c])]
        child = self.rng.choice(busy or children)
        jobs, at, sent_at = self._busy(nodes[child]), time.monotonic(), time.time()
        process = self.stack.children[child]
        process.terminate()
        try:
            code: int | None = process.wait(DRAIN_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        drained = time.monotonic() - at
        self.say(
            self.log.event(
                f"SIGTERM {nodes[child]} running {len(jobs)} job(s): exit {code} after {drained:.1f}s"
            )
        )
        self.log.scale_ins.append(KillEvent(at, child, nodes[child], jobs, drained))
        self.log.drain_exit_codes.append(code)
        self.stack.restart_child(child)
        self._wait_ready(nodes[child], sent_at)

    def _restart_redis(self) -> None:
        at = time.monotonic()
        self.say(self.log.event("stopping the queue's Redis (SIGTERM)"))
        if self.stack.restart_queue_redis(down_s=1.0):
            self.say(self.log.event("the queue's Redis is back"))
            self.log.redis_restarts.append(at)
        else:
            self.log.notes.append("the queue's Redis is not this stack's own: not restarted")

    def _failover(self) -> None:
        ha = self.stack.ha
        if ha is None:
            self.log.notes.append("the queue Redis is not under Sentinel (--ha): no failover")
            return
        old = ha.primary_port()
        at = time.monotonic()
        killed = ha.kill_primary()
        self.say(self.log.event(f"SIGKILL the queue's primary (port {old})"))
        new = ha.wait_promoted(killed.port)
        took = time.monotonic() - at
        self.say(
            self.log.event(f"port {new} promoted after {took:.1f}s; the old primary rejoins as its replica")
        )
        ha.restart_as_replica(killed)
        self.log.failovers.append(FailoverEvent(at, took, old, new))

    def _kill_kv_shard(self) -> None:
        """SIGKILL one shard of the KV cluster under the load, leave it down a while (its packs read
        as misses, its writes are dropped), then start it again, empty."""
        cluster = self.stack.kv_cluster
        if cluster is None:
            self.log.notes.append("the KV tier is not on a local cluster (--kv-shards): no shard killed")
            return
        shard = self.rng.randrange(cluster.shards)
        at = time.monotonic()
        cluster.kill_shard(shard)
        self.say(self.log.event(f"SIGKILL KV shard {shard} (port {cluster.ports[shard]})"))
        self._stop.wait(self.rng.uniform(*KV_SHARD_DOWN_S))
        cluster.restart_shard(shard)
        down = time.monotonic() - at
        self.say(self.log.event(f"KV shard {shard} back (empty) after {down:.1f}s"))
        self.log.kv_shard_kills.append(KvShardKill(at, shard, down))

    def _restart_api(self) -> None:
        """SIGKILL the api and start it again: what it ran (a batch's feeding, say) resumes from Redis."""
        at = time.monotonic()
        self.stack.restart_child("api")
        self.say(self.log.event("SIGKILL the api; restarted"))
        end = time.monotonic() + READY_TIMEOUT_S
        while not self.stack.api_ready() and time.monotonic() < end:
            time.sleep(0.1)
        self.say(self.log.event(f"the api answers again after {time.monotonic() - at:.1f}s"))
        self.log.api_restarts.append(at)

    def _wait_ready(self, node: str, after: float) -> float:
        """Until `node` beats again (a heartbeat sent after `after`, unix time) with its engine up."""
        end = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < end and not self._stop.is_set():
            for w in self._live():
                if w.name == node and w.engine is not None and w.sent_at > after:
                    return time.monotonic()
            self._check_exits()
            time.sleep(0.1)
        self.log.notes.append(f"{node} was not ready {READY_TIMEOUT_S:.0f}s after its restart")
        return time.monotonic()

    def _wait_all_ready(self) -> None:
        self._check_exits()
        for child in self.workers:
            self._wait_ready(self._node(child), 0.0)

    def _check_exits(self) -> None:
        """A child that died without our kill is a finding: say so, and start it again."""
        for name, child in list(self.stack.children.items()):
            if child.poll() is not None:
                self.say(self.log.event(f"{name} exited with {child.returncode} unasked; restarting it"))
                self.log.unexpected_exits.append(f"{name} exited with {child.returncode}")
                self.stack.restart_child(name)


def rss_mb(stack: Stack) -> dict[str, float]:
    """Each worker process's resident memory now, in MiB."""
    out: dict[str, float] = {}
    for name, child in stack.children.items():
        if name.startswith("worker") and child.poll() is None:
            try:
                out[name] = psutil.Process(child.pid).memory_info().rss / 1024**2
            except psutil.Error:
                continue
    return out
