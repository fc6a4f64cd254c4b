"""`kvferry chaos --batch`'s races, on top of its faults:

- a second api replica racing the first for the batch runner's lease: the holder (read from the
  lease's token, "<epoch>|api@host:pid", and signalled only if it is one of this stack's apis) is
  SIGSTOPped past the lease's TTL, so the other takes the lease, then resumed mid-pass: it must
  write nothing more (api/batches/lease.py);
- side batches whose input file is deleted while they run: the route must refuse (409
  file_in_use); then the file is removed from the store under them (as a crash or an operator
  would): each must end alone (failed, file_not_found, or completed if it finished first), the
  main batch running on;
- fan-out lines (`n` choices each): every choice in the output line.

And once the main batch is completed its output file must not change, nor be empty, a lease TTL
and more later (a stale runner's finalize once replaced it with an empty one)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import redis
from openai import OpenAI

from broker import keys
from ops.redis.server import free_port
from ops.stack.stack import Stack

PAST_TTL_S = 1.5  # a pause outlasts the runner lease's TTL (Settings.batch_lease_ttl_s) by this
SIDE_LINES = 8


def add_fanout(bodies: dict[str, dict[str, Any]], bad: set[str], every: int, n: int) -> set[str]:
    """Every `every`-th good line asks for `n` choices (n jobs); their ids."""
    chosen = {cid for i, cid in enumerate(sorted(bodies)) if every and i % every == 0 and cid not in bad}
    for cid in chosen:
        bodies[cid]["n"] = n
    return chosen


def fanout_short(output: list[dict[str, Any]], fanned: set[str], n: int) -> int:
    """Fan-out lines answered with fewer than `n` choices."""
    short = 0
    for line in output:
        if line.get("custom_id") in fanned:
            choices = ((line.get("response") or {}).get("body") or {}).get("choices") or []
            short += len(choices) != n
    return short


def holder_pid(token: str) -> int | None:
    """The pid in a runner lease's token "<epoch>|api@<host>:<pid>"."""
    _, _, name = token.partition("|")
    pid = name.rpartition(":")[2]
    return int(pid) if pid.isdigit() else None


def pause_s(stack: Stack) -> float:
    """Past the runner lease's TTL: a holder paused this long has lost it."""
    return stack.settings.batch_lease_ttl_s + PAST_TTL_S


def start_replica(stack: Stack) -> str:
    """A second api on the stack's Redis and file store; its url."""
    args, env, drop = stack._specs["api"]
    port = free_port()
    stack._spawn("api2", args, {**env, "KVFERRY_API_PORT": str(port)}, drop)
    url = f"http://{stack.settings.api_host}:{port}"
    deadline = time.monotonic() + 120
    while not stack._http_ok(f"{url}/healthz"):
        if time.monotonic() > deadline:
            raise RuntimeError("the second api did not start")
        time.sleep(0.5)
    return url


class LeaseRacer(threading.Thread):
    """Pauses the runner lease's holder `pauses` times, `gap_s` apart, each past the lease's TTL."""

    def __init__(self, stack: Stack, pauses: int, gap_s: float, say: Callable[[str], None]) -> None:
        super().__init__(name="lease-racer", daemon=True)
        self.stack, self.pauses, self.gap_s, self.say = stack, pauses, gap_s, say
        self.pause_s = pause_s(stack)
        self.done = 0
        self.epochs: list[int] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(self.pause_s + 5)

    def _epoch(self, client: redis.Redis) -> int:
        return int(client.get(keys.BATCH_RUNNER_EPOCH) or 0)

    def run(self) -> None:
        client = redis.Redis.from_url(self.stack.settings.queue_url, socket_timeout=5)
        ours = {"api", "api2"}
        while self.done < self.pauses and not self._halt.wait(self.gap_s):
            try:
                raw = client.get(keys.BATCH_RUNNER_LEASE)
                token = raw.decode() if isinstance(raw, bytes) else str(raw or "")
                before = self._epoch(client)
            except redis.RedisError:
                continue  # the queue Redis restarts: try again later
            pid = holder_pid(token)
            pids = {self.stack.children[n].pid: n for n in ours if n in self.stack.children}
            if pid is None or pid not in pids:  # only ever one of this stack's own apis
                continue
            os.kill(pid, signal.SIGSTOP)
            self.say(f"SIGSTOP {pids[pid]} (the runner, epoch {before}) for {self.pause_s}s")
            try:
                self._halt.wait(self.pause_s)
            finally:
                with contextlib.suppress(ProcessLookupError):  # SIGKILLed meanwhile (an api restart)
                    os.kill(pid, signal.SIGCONT)
            with contextlib.suppress(redis.RedisError):
                self.epochs.append(self._epoch(client) - before)
            self.done += 1
        client.close()


def side_batches(client: OpenAI, model: str, count: int, files_dir: Path) -> dict[str, Any]:
    """`count` small batches; each input's DELETE tried (must be refused), then removed from the
    store. Their ids and the deletes refused and allowed."""
    ids, refused, allowed = [], 0, 0
    for s in range(count):
        lines = [
            {
                "custom_id": f"side{s}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "messages": [{"role": "user", "content": f"side {s} {i}"}]},
            }
            for i in range(SIDE_LINES)
        ]
        data = "".join(json.dumps(x) + "\n" for x in lines).encode()
        file_id = client.files.create(file=("side.jsonl", io.BytesIO(data)), purpose="batch").id
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        ids.append(batch.id)
        try:
            client.files.delete(file_id)
            allowed += 1
        except openai.ConflictError:
            refused += 1
        with contextlib.suppress(FileNotFoundError):
            (files_dir / file_id).unlink()  # gone anyway: a crash, an operator
    return {"ids": ids, "input_deletes_refused": refused, "input_deletes_allowed": allowed}


def side_outcomes(client: OpenAI, ids: list[str], deadline: float, terminal: set[str]) -> dict[str, Any]:
    """How the side batches ended: alone (failed for the file, or completed first), or stuck."""
    alone = stuck = duplicated = 0
    for batch_id in ids:
        while (batch := client.batches.retrieve(batch_id)).status not in terminal:
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        codes = [e.code for e in (batch.errors.data if batch.errors and batch.errors.data else [])]
        if batch.status == "completed" or (batch.status == "failed" and "file_not_found" in codes):
            alone += 1
        elif batch.status not in terminal:
            stuck += 1
        if batch.output_file_id:
            text = client.files.content(batch.output_file_id).text
            seen = [json.loads(x)["custom_id"] for x in text.splitlines() if x]
            duplicated += len(seen) - len(set(seen))
    return {
        "side_batches": len(ids),
        "side_ended_alone": alone,
        "side_stuck": stuck,
        "side_duplicated": duplicated,
    }


def output_stable(client: OpenAI, file_id: str | None, wait_s: float) -> dict[str, Any]:
    """The completed batch's output file, read now and `wait_s` later: never empty, never changed."""
    if file_id is None:
        return {"output_empty_after_completed": True, "output_changed_after_completed": False}
    first = client.files.content(file_id).content
    time.sleep(wait_s)
    try:
        later = client.files.content(file_id).content
    except openai.NotFoundError:
        later = b""
    return {
        "output_empty_after_completed": not first or not later,
        "output_changed_after_completed": first != later,
    }
