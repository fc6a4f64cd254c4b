"""`kvferry chaos --batch`: a Batch API batch under faults. Starts a stack, answers every line of
a seeded batch online first (the fault-free reference, through the same api), then submits the
same lines as one batch (and a few bad lines) and, while it runs, SIGKILLs workers, restarts the
queue's Redis and SIGKILLs the api (each started again). Then it reads the output and error files
and counts, by custom_id: lost (in neither file), duplicated (more than once across both),
failed (a good line in the error file) and mismatched (not the reference's answer, token for
token as text). `lines_exactly_once` holds when every line is in exactly one file, once.

With its races (ops/chaos/batch_races.py): a second api replica racing the first for the runner's
lease (the holder paused past the lease's TTL), side batches whose input file is deleted under
them, fan-out lines, and the completed output file read again later: never empty, never changed."""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from openai import AsyncOpenAI, OpenAI

from ops.bench.batch import client as bc
from ops.chaos import batch_races as races
from ops.chaos.fault_log import stamped
from ops.chaos.faults import FaultInjector
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack

API_KEY = "chaos-batch"
BAD_EVERY = 25  # one line in this many is invalid: it must land in the error file, once


@dataclass(frozen=True, slots=True)
class BatchChaosConfig:
    workers: int = 2
    lines: int = 600
    max_tokens: int = 32
    kills: int = 6
    redis_restarts: int = 1
    api_restarts: int = 1
    gap_s: tuple[float, float] = (1.0, 3.0)
    seed: int = 0
    timeout_s: float = 3600.0
    api_replicas: int = 2  # 2: a second api races the first for the runner's lease
    lease_pauses: int = 2  # the runner lease's holder SIGSTOPped past its TTL, then resumed
    side_batches: int = 2  # batches whose input file is deleted under them
    fanout_every: int = 10  # one good line in this many asks for `fanout_n` choices
    fanout_n: int = 4

    @classmethod
    def quick(cls, **overrides: Any) -> BatchChaosConfig:
        from dataclasses import replace

        base = cls(lines=60, max_tokens=16, kills=2, gap_s=(0.2, 0.6), timeout_s=300.0, lease_pauses=1)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})


def _lines(model: str, n: int, max_tokens: int) -> tuple[dict[str, dict[str, Any]], set[str]]:
    bodies, bad = {}, set()
    for i in range(n):
        body = bc.chat_body(model, bc.question("chaos", i), max_tokens)
        if i % BAD_EVERY == BAD_EVERY - 1:
            body["max_tokens"] = -1  # a 400 online: the line's error, not the batch's
            bad.add(f"line-{i}")
        bodies[f"line-{i}"] = body
    return bodies, bad


async def _reference(
    base_url: str, bodies: dict[str, dict[str, Any]], concurrency: int = 16
) -> dict[str, str]:
    client = AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=2, timeout=300)
    todo = list(bodies.items())
    out: dict[str, str] = {}

    async def one() -> None:
        while todo:
            cid, body = todo.pop()
            reply = await client.chat.completions.create(**bc.client_kwargs(body))
            out[cid] = reply.choices[0].message.content or ""

    try:
        await asyncio.gather(*(one() for _ in range(concurrency)))
    finally:
        await client.close()
    return out


def _retrying(call: Callable[[], Any], deadline: float) -> Any:
    """The api restarts under us: retry a call until it answers (or the deadline)."""
    while True:
        try:
            return call()
        except (openai.APIConnectionError, openai.InternalServerError, openai.APITimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait(client: OpenAI, batch_id: str, deadline: float) -> Any:
    while True:
        batch = _retrying(lambda: client.batches.retrieve(batch_id), deadline)
        if batch.status in bc.TERMINAL:
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status}")
        time.sleep(0.25)


def plan(config: BatchChaosConfig) -> list[str]:
    """The faults in order: the Redis restarts and api SIGKILLs first (each takes a second or two,
    so they land while the batch surely runs), then the kills (each waits for its worker to be
    ready again: the batch must outlast them)."""
    return ["redis"] * config.redis_restarts + ["api"] * config.api_restarts + ["kill"] * config.kills


def count(
    output: list[dict[str, Any]], errors: list[dict[str, Any]], reference: dict[str, str], bad: set[str]
) -> dict[str, Any]:
    """The run's figures, by custom_id (see the module's docstring)."""
    expected = set(reference) | bad
    seen = Counter(str(line.get("custom_id")) for line in [*output, *errors])
    texts = {str(line.get("custom_id")): bc.content_of(line) for line in output}
    failed = {str(line.get("custom_id")) for line in errors} - bad
    lost = sorted(expected - set(seen))
    duplicated = sorted(cid for cid, n in seen.items() if n > 1)
    mismatched = sorted(cid for cid, text in texts.items() if cid in reference and text != reference[cid])
    unknown = sorted(set(seen) - expected)
    return {
        "lines_total": len(expected),
        "lines_good": len(reference),
        "lines_bad": len(bad),
        "lines_completed": len(texts),
        "error_lines": len(errors),
        "lines_lost": len(lost),
        "lines_duplicated": len(duplicated),
        "lines_failed": len(failed),
        "lines_mismatched": len(mismatched),
        "lines_unknown": len(unknown),
        "lines_exactly_once": not lost and not duplicated and not unknown,
        "examples": {"lost": lost[:5], "duplicated": duplicated[:5], "mismatched": mismatched[:5]},
    }


def run_batch_chaos(
    settings: Settings, config: BatchChaosConfig, run_dir: Path | None = None, log: Any = print
) -> dict[str, Any]:
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="kvferry-chaos-batch-"))
    settings = settings.with_overrides(api_port=free_port(), api_key=API_KEY, api_keys=None)
    log(stamped(f"starting {config.workers} worker(s), the api and Redis; logs in {run_dir}"))
    with Stack(settings, config.workers, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()
        base = f"{stack.api_url}/v1"
        deadline = time.monotonic() + config.timeout_s
        bodies, bad = _lines(stack.settings.served_model, config.lines, config.max_tokens)
        fanned = races.add_fanout(bodies, bad, config.fanout_every, config.fanout_n)
        if config.api_replicas > 1:
            races.start_replica(stack)
        log(stamped(f"reference: {len(bodies) - len(bad)} lines answered online, no faults"))
        reference = asyncio.run(_reference(base, {k: v for k, v in bodies.items() if k not in bad}))
        client = OpenAI(base_url=base, api_key=API_KEY, max_retries=0, timeout=60)
        started = time.monotonic()
        batch = bc.submit(client, bc.jsonl(bodies), name="chaos.jsonl")
        log(stamped(f"batch {batch.id}: {len(bodies)} lines; faults start"))
        rng = random.Random(config.seed)
        faults = FaultInjector(
            stack, config.kills, config.redis_restarts, rng, config.gap_s, deadline, log,
            api_restarts=config.api_restarts,
        )  # fmt: skip
        faults.plan = plan(config)
        faults.start()
        pauses = config.lease_pauses if config.api_replicas > 1 else 0
        # its first pause after the quick faults (a Redis restart, an api SIGKILL) are done
        racer = races.LeaseRacer(stack, pauses, 5.0, lambda m: log(stamped(m)))
        racer.start()
        model, files_dir = stack.settings.served_model, stack.settings.api_config().files_dir
        side = _retrying(lambda: races.side_batches(client, model, config.side_batches, files_dir), deadline)
        try:
            batch = _wait(client, batch.id, deadline)
            ended = time.monotonic()
        finally:
            faults.stop()  # a fault after the batch ended tests nothing: the rest of the plan is dropped
            racer.stop()
        duration = ended - started
        batch = _wait(client, batch.id, deadline)
        output = _retrying(lambda: bc.read_lines(client, batch.output_file_id), deadline)
        errors = _retrying(lambda: bc.read_lines(client, batch.error_file_id), deadline)
        sides = _retrying(lambda: races.side_outcomes(client, side["ids"], deadline, bc.TERMINAL), deadline)
        wait_s = races.pause_s(stack)
        stable = _retrying(lambda: races.output_stable(client, batch.output_file_id, wait_s), deadline)
        client.close()
    result = count(output, errors, reference, bad)
    result.update(
        fanout_lines=len(fanned),
        fanout_short=races.fanout_short(output, fanned, config.fanout_n),
        input_deletes_refused=side["input_deletes_refused"],
        input_deletes_allowed=side["input_deletes_allowed"],
        lease_pauses=racer.done,
        lease_takeovers=sum(1 for e in racer.epochs if e > 0),
        **sides,
        **stable,
    )
    fault_log = faults.log
    result.update(
        batch_status=batch.status,
        kills=sum(k.at < ended for k in fault_log.kills),
        redis_restarts=sum(at < ended for at in fault_log.redis_restarts),
        api_restarts=sum(at < ended for at in fault_log.api_restarts),
        unexpected_exits=fault_log.unexpected_exits,
        duration_s=duration,
        events=fault_log.events,
        notes=fault_log.notes,
    )
    result["passed"] = (
        result["lines_exactly_once"]
        and result["lines_mismatched"] == 0
        and result["lines_failed"] == 0
        and batch.status == "completed"
        and result["fanout_short"] == 0
        and result["input_deletes_allowed"] == 0
        and result["side_stuck"] == 0
        and result["side_duplicated"] == 0
        and not result["output_empty_after_completed"]
        and not result["output_changed_after_completed"]
    )
    return result


def render(result: dict[str, Any]) -> str:
    keys = (
        "batch_status", "lines_total", "lines_completed", "error_lines", "lines_lost", "lines_duplicated",
        "lines_failed", "lines_mismatched", "lines_exactly_once", "kills", "redis_restarts",
        "api_restarts", "fanout_lines", "fanout_short", "input_deletes_refused", "input_deletes_allowed",
        "side_ended_alone", "side_stuck", "lease_pauses", "lease_takeovers", "output_empty_after_completed",
        "output_changed_after_completed", "duration_s", "passed",
    )  # fmt: skip
    return "\n".join(f"{k:20s} {result[k]}" for k in keys)
