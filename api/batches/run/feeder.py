"""Feeding a batch's lines as jobs. A line is validated as the online endpoints validate a body
(intake.parse); a bad one goes to the batch's error part and counts failed. A good one becomes a
job per prompt and choice, as online (job_class "batch", its batch's id and tenant, no tenant
cap: a batch waits for free slots instead), routed cache-aware like any job (api/routing/router.py).

Its jobs are recorded as running (state.feed: with the cursor, atomically) BEFORE they are sent,
with ids derived from the batch, line and choice: a runner that dies in between leaves a running
line whose jobs are missing, and `send` sends them (the same ids) on the next pass."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from api import intake
from api.batches import state
from api.batches.input import read_from
from api.batches.lines import BatchLine, error_line, line_id, parse_line
from api.batches.parts import Parts
from api.batches.records import BatchRecord
from api.context import ApiContext
from api.jobs.meta import JobMeta
from api.routing.router import Route, choose_queue, together
from api.schema.answer.bodies import error_body
from api.schema.openai import CompletionRequest
from broker import keys
from broker.errors import InvalidRequestError
from broker.messages import GenerateJob

if TYPE_CHECKING:
    from api.batches.run.placement import Room

_JOB_IDS = uuid.UUID("5f0c2f9e-3a53-4c1b-8f0e-2b7d0c6a9e41")  # namespace of batch line job ids


@dataclass(frozen=True, slots=True)
class Running:
    """A fed line: where it is in the input file, its jobs (prompt-major, choices in order) and
    the worker they went to (None: the shared queue)."""

    offset: int
    jobs: list[str]
    fed_at: float
    worker: str | None = None

    def to_json(self) -> str:
        raw = {"offset": self.offset, "jobs": self.jobs, "fed_at": self.fed_at, "worker": self.worker}
        return json.dumps(raw)

    @classmethod
    def from_json(cls, text: str) -> Running:
        raw = json.loads(text)
        return cls(int(raw["offset"]), list(raw["jobs"]), float(raw["fed_at"]), raw.get("worker"))


def job_ids(batch_id: str, line_no: int, request: CompletionRequest) -> list[str]:
    groups = request.split() if request.fans_out else [[request]]
    return [
        str(uuid.uuid5(_JOB_IDS, f"{batch_id}:{line_no}:{g}:{c}"))
        for g, group in enumerate(groups)
        for c in range(len(group))
    ]


def parse(ctx: ApiContext, rec: BatchRecord, line_no: int, text: bytes) -> BatchLine:
    def online(url: str, body: Any) -> CompletionRequest:
        request = intake.parse(ctx, url, body, None)
        if request.session_id is not None:  # a batch's lines run in any order, at once
            raise InvalidRequestError("a batch line cannot continue a session", "session_id")
        return request

    return parse_line(line_no, text, online, rec.endpoint)


def fits(jobs: int, left: int, window: int, idle: bool) -> bool:
    """Whether a line of `jobs` jobs is fed now, with `left` seats free for its batch: when they
    hold it, or when it is larger than the whole batch window and its batch runs nothing (`idle`),
    as it would never fit otherwise: it then runs alone and the window waits for it."""
    return jobs <= left or (jobs > window and idle)


async def feed(
    ctx: ApiContext, fence: state.Fence, rec: BatchRecord, parts: Parts, seats: int, room: Room, running: int
) -> int:
    """Feed lines from the batch's cursor while their jobs fit in `seats` (`room`: the batch window
    and each worker's free seats; `running`: the batch's jobs running now); the seats they took
    (bad lines take none)."""
    store = ctx.files
    chunk = await asyncio.to_thread(
        read_from, store, rec.input_file_id, rec.cursor_offset, rec.cursor_line, max(seats, 1)
    )  # every good line takes a seat at least
    taken, cursor = 0, rec.cursor_line
    for i, (line_no, offset, text) in enumerate(chunk.lines):
        if i + 1 < len(chunk.lines):
            next_line, next_offset = chunk.lines[i + 1][0], chunk.lines[i + 1][1]
        else:
            next_line, next_offset = chunk.next_line, chunk.next_offset
        line = parse(ctx, rec, line_no, text)
        if line.request is None:
            body = error_body(line.error_message or "invalid request", code=line.error_code)
            record = error_line(line_id(rec.id, line_no), line.custom_id, line.status_code, body)
            await fence.check()
            await parts.errors(rec.id, [record])  # written first: a crash now writes it again
            if not await state.feed(fence, rec.id, cursor, line_no, next_line, next_offset, ""):
                return taken  # another runner moved the cursor
            parts.metrics.lines.labels(rec.tenant, "failed").inc()
        else:
            ids = job_ids(rec.id, line_no, line.request)
            jobs = len(ids)
            if not fits(jobs, seats - taken, room.window, idle=not (taken or running)):
                return taken  # the cursor stays on it: fed when seats free up
            worker = None
            if ctx.config.routing != "shared":
                worker = room.place((await _route(ctx, _batch_job(rec, line.request))).worker, jobs)
            running_line = Running(offset, ids, time.time(), worker)
            if not await state.feed(
                fence, rec.id, cursor, line_no, next_line, next_offset, running_line.to_json()
            ):
                return taken
            await send(ctx, rec, line.request, running_line, [False] * jobs)  # none sent yet
            taken += jobs
        cursor = rec.cursor_line = next_line
        rec.cursor_offset = next_offset
    if chunk.at_end:
        rec.fed_all = True
        await state.update(fence, rec.id, fed_all=1)
    return taken


async def sent(ctx: ApiContext, running: Running) -> list[bool]:
    """Which of a recorded line's jobs were sent (their metadata is in Redis)."""
    pipe = ctx.jobs.redis.pipeline(transaction=False)
    for job_id in running.jobs:
        pipe.exists(keys.job_meta(job_id))
    return [bool(n) for n in await pipe.execute()]


async def send(
    ctx: ApiContext, rec: BatchRecord, request: CompletionRequest, running: Running, done: list[bool]
) -> None:
    """Send the line's jobs not `done` (sent) yet, under their recorded ids."""
    if all(done):
        return
    groups = request.split() if request.fans_out else [[request]]
    config = ctx.config
    route: Route | None = None
    if running.worker is not None and config.routing != "shared":  # placed by seats (placement.py)
        route = Route(keys.worker_queue(running.worker), f"batch seats: {running.worker}", running.worker)
    elif len(running.jobs) > 1 and config.routing != "shared":  # a line's jobs on one worker
        first = await _route(ctx, groups[0][0].to_job(rec.tenant))
        route = await together(
            ctx.jobs.redis, first, config.route_max_waiting, ctx.jobs.fleet, memory=ctx.routing
        )
    requests = [r for group in groups for r in group]
    for job_id, request_i, was_sent in zip(running.jobs, requests, done, strict=True):
        if was_sent:
            continue
        job = _batch_job(rec, request_i)
        chosen = route or await _route(ctx, job)
        meta = JobMeta.of(
            job_id, request_i, chosen.queue, chosen.reason, job.submitted_at or time.time(), rec.tenant
        )
        await ctx.jobs.submit(meta, job)


def _batch_job(rec: BatchRecord, request: CompletionRequest) -> GenerateJob:
    return msgspec.structs.replace(request.to_job(rec.tenant), job_class="batch", batch_id=rec.id)


async def _route(ctx: ApiContext, job: Any) -> Route:
    config = ctx.config
    return await choose_queue(
        ctx.jobs.redis,
        job,
        config.routing,
        config.route_max_waiting,
        prefetch_hints=config.prefetch_hints,
        cache=ctx.jobs.fleet,
        memory=ctx.routing,
    )
