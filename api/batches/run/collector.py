"""Collecting a batch's finished lines: each pass reads the final event of every running line's
jobs (one pipelined read of their end streams), builds a finished line's output with the online
endpoint's response body (all its jobs' choices in one body, as online), appends it to the output
or error part (fsynced) and THEN marks it done in Redis. A runner that dies in between writes the
line again on its next pass; finalize keeps one copy of each.

A line whose jobs stay silent is looked at more closely now and then: a job never sent (the
runner died between recording and sending it) is sent; a job that ended without a final event
(revoked, say) is read from Celery's state, as the online endpoints do."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from api.batches import state
from api.batches.input import read_at
from api.batches.lines import error_line, line_id, ok_line
from api.batches.parts import Parts
from api.batches.records import BatchRecord
from api.batches.run.feeder import Running, parse, send, sent
from api.context import ApiContext
from api.jobs.view import failed_body
from api.jobs.wait import silent_outcome
from api.schema.answer.bodies import error_body, fanned_body
from broker import keys
from broker.codec import decode_event
from broker.jobs.events import EVENT_FIELD
from broker.messages import JobDone, JobFailed, StreamEvent

SILENT_S = 5.0  # a line with no final this long after it was fed is looked at closely
LOOKS_PER_PASS = 16  # at most this many such looks per batch and pass


class Collector:
    def __init__(self, ctx: ApiContext, parts: Parts) -> None:
        self.ctx = ctx
        self.parts = parts
        self._next_look: dict[str, float] = {}  # "<batch>:<line>" -> when to look again

    def keep(self, batch_ids: set[str]) -> None:
        """Forget the looks of batches no longer active (ended, cancelled with silent lines)."""
        self._next_look = {k: v for k, v in self._next_look.items() if k.partition(":")[0] in batch_ids}

    async def collect(self, fence: state.Fence, rec: BatchRecord) -> int:
        """Write every running line of the batch whose jobs have all ended; how many."""
        redis = self.ctx.jobs.redis
        running = {n: Running.from_json(text) for n, text in (await state.running(redis, rec.id)).items()}
        if not running:
            return 0
        pipe = redis.pipeline(transaction=False)
        for line in running.values():
            for job_id in line.jobs:
                pipe.xrange(keys.job_end(job_id), count=1)
        replies = iter(await pipe.execute())
        finished: dict[int, list[StreamEvent]] = {}
        silent: list[int] = []
        for line_no, line in running.items():
            events = [
                decode_event(r[0][1][EVENT_FIELD]) if r else None for r in (next(replies) for _ in line.jobs)
            ]
            if all(e is not None for e in events):
                finished[line_no] = [e for e in events if e is not None]
            elif time.time() - line.fed_at > SILENT_S:
                silent.append(line_no)
        for line_no in silent[:LOOKS_PER_PASS]:
            looked = await self._look(rec, line_no, running[line_no])
            if looked is not None:
                finished[line_no] = looked
        return await self._write(fence, rec, running, finished)

    async def _look(self, rec: BatchRecord, line_no: int, line: Running) -> list[StreamEvent] | None:
        key = f"{rec.id}:{line_no}"
        now = time.monotonic()
        if self._next_look.get(key, 0.0) > now:
            return None
        self._next_look[key] = now + self.ctx.jobs.state_poll_s
        were_sent = await sent(self.ctx, line)
        if not all(were_sent):  # a runner died between recording the line and sending its jobs
            text = await asyncio.to_thread(read_at, self.ctx.files, rec.input_file_id, line.offset)
            parsed = parse(self.ctx, rec, line_no, text)
            if parsed.request is not None:
                await send(self.ctx, rec, parsed.request, line, were_sent)
        events: list[StreamEvent] = []
        for job_id in line.jobs:
            end = keys.job_end(job_id)
            got: Any = await self.ctx.jobs.redis.xrange(end, count=1)
            event = (
                decode_event(got[0][1][EVENT_FIELD])
                if got
                else await silent_outcome(self.ctx.jobs, job_id, end, "0-0")
            )
            if event is None:
                return None
            events.append(event)
        return events

    async def _write(
        self,
        fence: state.Fence,
        rec: BatchRecord,
        running: dict[int, Running],
        finished: dict[int, list[StreamEvent]],
    ) -> int:
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        outcome: dict[int, str] = {}
        store = self.ctx.files
        for line_no, events in sorted(finished.items()):
            if rec.status == "cancelling" and any(_aborted(e) for e in events):
                continue  # cancelled before it finished: not an answer
            text = await asyncio.to_thread(read_at, store, rec.input_file_id, running[line_no].offset)
            parsed = parse(self.ctx, rec, line_no, text)
            rid = line_id(rec.id, line_no)
            failed = next((e for e in events if isinstance(e, JobFailed)), None)
            if parsed.request is None:  # the input changed under us: never, but never lost either
                body = error_body(parsed.error_message or "invalid request", code=parsed.error_code)
                errors.append(error_line(rid, parsed.custom_id, parsed.status_code, body))
                outcome[line_no] = "failed"
            elif failed is not None:
                errors.append(error_line(rid, parsed.custom_id, failed.status_code, failed_body(failed)))
                outcome[line_no] = "failed"
            else:
                outputs.append(
                    ok_line(rid, parsed.custom_id, _body(parsed.request, running[line_no], events))
                )
                outcome[line_no] = "completed"
        if outcome:
            await fence.check()
        await self.parts.output(rec.id, outputs)
        await self.parts.errors(rec.id, errors)
        for line_no, result in outcome.items():
            if await state.done(fence, rec.id, line_no, result):
                self.parts.metrics.lines.labels(rec.tenant, result).inc()
                for event in finished[line_no]:
                    if isinstance(event, JobDone):  # counted as the online endpoints count theirs
                        self.ctx.metrics.tokens(rec.tenant, event.result.usage)
                        self.ctx.metrics.observe_queue_wait(rec.tenant, "batch", event.result.queue_wait_s)
            self._next_look.pop(f"{rec.id}:{line_no}", None)
        return len(outcome)


def _aborted(event: StreamEvent) -> bool:
    return isinstance(event, JobDone) and event.result.finish_reason == "abort"


def _body(request: Any, line: Running, events: list[StreamEvent]) -> dict[str, Any]:
    """The online endpoint's body: a choice per prompt and choice (best_of's n best), one usage."""
    results = [e.result for e in events if isinstance(e, JobDone)]
    sizes = [len(group) for group in request.split()] if request.fans_out else [1]
    prefix = "chatcmpl" if request.is_chat else "cmpl"
    return fanned_body(request, sizes, results, f"{prefix}-{line.jobs[0]}")
