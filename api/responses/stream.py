"""A response's events as server-sent events, from its job's stream: a new response's stream, or
a background one's resumed after `starting_after` (any api, any time while the job's stream
lives: it replays the job's events from the start and sends those numbered after it)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from fastapi.responses import Response, StreamingResponse
from redis import RedisError

from api.answer.completion import abandon
from api.context import ApiContext
from api.jobs.errors import ClientGoneError, JobTimeoutError
from api.responses.events import Event, ResponseEvents, sse
from api.responses.record import ResponseRecord
from api.responses.settle import finish
from api.schema.answer import sse as chat_sse
from broker.messages import JobDone, TokenDelta

log = logging.getLogger(__name__)


async def stream_response(
    ctx: ApiContext,
    record: ResponseRecord,
    alive: Callable[[], Awaitable[bool]] | None,
    starting_after: int,
    owns_job: bool,
) -> Response:
    """owns_job: nobody else waits for the job (a foreground response): a client that leaves
    cancels it. A background response's job runs on whoever reads it."""
    body = _events(ctx, record, alive, starting_after, owns_job)
    return StreamingResponse(body, media_type="text/event-stream", headers=chat_sse.HEADERS)


async def _events(
    ctx: ApiContext,
    record: ResponseRecord,
    alive: Callable[[], Awaitable[bool]] | None,
    starting_after: int,
    owns_job: bool,
) -> AsyncIterator[bytes]:
    writer = ResponseEvents(record)

    def fresh(events: list[Event]) -> list[bytes]:
        return [sse(e) for e in events if e["sequence_number"] > starting_after]

    ended = False
    events = ctx.jobs.follow(record.job_id, ctx.config.job_timeout_s, alive)
    try:
        for chunk in fresh(writer.start()):
            yield chunk
        async for event in events:
            if isinstance(event, TokenDelta):
                out = writer.delta(event)
            else:
                ended = True
                done = await finish(ctx, record, event, seen_live=True)
                if isinstance(event, JobDone):
                    out = writer.end(done, event.result.text, event.result.finish_reason)
                else:
                    out = writer.failed(done)
            for chunk in fresh(out):
                yield chunk
    except JobTimeoutError as exc:
        yield sse(
            {
                "type": "error",
                "sequence_number": writer.seq,
                "code": "timeout",
                "message": str(exc),
                "param": None,
            }
        )
    except ClientGoneError:
        pass
    except RedisError as exc:
        log.warning("response %s: lost the queue service mid-stream: %s", record.id, exc)
        yield sse(
            {
                "type": "error",
                "sequence_number": writer.seq,
                "code": "service_unavailable",
                "message": "the queue service is unavailable",
                "param": None,
            }
        )
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()
            if owns_job and not ended:
                meta = await ctx.jobs.meta(record.job_id)
                if meta is not None:
                    await abandon(ctx, meta)
