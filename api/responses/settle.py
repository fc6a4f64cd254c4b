"""Applying a response's job end to its record, once, whoever sees it first: the api that waits
on it, a background response's watcher, or any api a GET reaches after a restart (the job's end
stays in its Redis stream for job_ttl_s)."""

from __future__ import annotations

import logging

import msgspec

from api.answer.completion import ended as job_ended
from api.answer.completion import settle as job_settle
from api.context import ApiContext
from api.jobs.view import error_code
from api.responses import conversations, render
from api.responses import record as records
from api.responses.items import output_items
from api.responses.record import ResponseRecord
from api.tool_calls.registry import parser_for
from broker.messages import JobDone, JobFailed, StreamEvent

log = logging.getLogger(__name__)


def apply(record: ResponseRecord, event: StreamEvent) -> ResponseRecord:
    """The record as the job's final event leaves it (pure)."""
    if isinstance(event, JobDone):
        r = event.result
        parser = parser_for(record.tool_parser) if record.tool_parser else None
        logprobs = r.logprobs if record.logprobs else None
        items, answer = output_items(record.id, parser, r.text, r.finish_reason, logprobs)
        body = render.ended(record.body, items, r.usage, r.finish_reason, r.worker)
        return msgspec.structs.replace(record, body=body, answer=answer)
    if isinstance(event, JobFailed):
        body = render.failed(record.body, error_code(event) or event.error_type, event.message)
        return msgspec.structs.replace(record, body=body)
    raise ValueError(f"not a final event: {type(event).__name__}")


async def finish(
    ctx: ApiContext, record: ResponseRecord, event: StreamEvent, seen_live: bool
) -> ResponseRecord:
    """Apply the end (once: a second caller gets the stored record back) and settle the job
    (its tenant seat, its metrics). seen_live: the end came as it happened (metrics of latency)."""
    done = apply(record, event)
    redis, ttl_s = ctx.jobs.redis, ctx.config.response_ttl_s
    ok = done.status in ("completed", "incomplete")
    new_items = [*done.input_items, *done.body["output"]] if done.conversation_id and ok else []
    if record.stored:
        if not await records.end_once(redis, done, new_items, ttl_s):
            return await records.load(redis, record.tenant, record.id) or done
    elif new_items and done.conversation_id:
        await conversations.append(redis, done.tenant, done.conversation_id, new_items, ttl_s)
    meta = await ctx.jobs.meta(record.job_id)
    if meta is not None:
        if seen_live:
            await job_ended(ctx, meta, "chat", event)
        else:
            result = event.result if isinstance(event, JobDone) else None
            await job_settle(ctx, meta, result.usage if result else None)
    return done


async def cancel(ctx: ApiContext, record: ResponseRecord) -> ResponseRecord:
    """Cancel a response still running: its job stops, its status is cancelled."""
    if record.ended:
        return record
    done = msgspec.structs.replace(record, body={**record.body, "status": "cancelled"})
    if not await records.end_once(ctx.jobs.redis, done, [], ctx.config.response_ttl_s):
        return await records.load(ctx.jobs.redis, record.tenant, record.id) or record
    await ctx.jobs.cancel(record.job_id)  # after the end is ours: the job's own end then loses
    meta = await ctx.jobs.meta(record.job_id)
    if meta is not None:
        await job_settle(ctx, meta, None)
    return done


async def refresh(ctx: ApiContext, record: ResponseRecord) -> ResponseRecord:
    """A running response as its job stands now: ended (applied here if nobody has), in
    progress once a worker holds it or streamed a token, else queued."""
    if record.ended:
        return record
    count, last = await ctx.jobs.last_event(record.job_id)
    final = last if isinstance(last, (JobDone, JobFailed)) else None
    if final is not None:
        return await finish(ctx, record, final, seen_live=False)
    status = "in_progress" if count or await ctx.jobs.lease_worker(record.job_id) else record.status
    return msgspec.structs.replace(record, body={**record.body, "status": status})
