"""The app factory. Nothing connects at import: create_app builds clients that connect lazily."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.background import STOP_WAIT_S, stop_tasks
from api.batches import parts as batch_parts
from api.batches.run.runner import BatchRunner
from api.config import ApiConfig
from api.context import ApiContext
from api.dispatch.dispatcher import Dispatcher
from api.dispatch.lease import DispatchLease, api_name
from api.errors import install_error_handlers
from api.files.store import DirStore
from api.files.sweeper import FileSweeper, SweepTerms
from api.jobs.admission import Admission
from api.jobs.client import JobClient
from api.metrics.prometheus import ApiMetrics, RequestCounter
from api.metrics.tier import TierReader
from api.routes import batches, conversations, files, jobs, openai, ops, responses, sessions, tokenize
from api.schema import openapi_doc
from api.tenants import KeyRing
from api.tokenizer import Tokenizer
from broker import keys

log = logging.getLogger(__name__)


def create_app(config: ApiConfig, tokenizer: Tokenizer | None = None) -> FastAPI:
    """tokenizer: the served model's, for /tokenize and /detokenize (None: they answer 503)."""
    metrics = ApiMetrics(config.scale_policy)
    key_ring = KeyRing(config.api_key, config.api_keys, config.api_keys_file, config.api_keys_reload_s)
    admission = Admission(config.dispatch_headroom, config.fair_quota, key_ring.weight, config.job_timeout_s)
    job_client = JobClient(
        config.broker,
        job_ttl_s=config.job_ttl_s,
        accept_replicas=config.accept_replicas,
        accept_wait_ms=config.accept_wait_ms,
        on_unreplicated=metrics.accepts_unreplicated.inc,
        admission=admission,
    )
    ctx = ApiContext(
        config=config,
        jobs=job_client,
        metrics=metrics,
        started=int(time.time()),
        keys=key_ring,
        tier=TierReader(job_client.redis),
        files=DirStore(config.files_dir),
        tokenizer=tokenizer,
    )
    dispatcher = Dispatcher(job_client, config.dispatch_headroom, key_ring.weights)
    metrics.background.watch("dispatcher", dispatcher.failures)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        dispatcher.start()  # one api of all replicas releases parked jobs (api/dispatch/)
        runner = BatchRunner(ctx)  # runs batches while this api holds the runner's lease
        metrics.background.watch("batch_runner", runner.failures)
        task = asyncio.create_task(runner.run(), name="kvferry-batch-runner")
        await secure_store(ctx)
        terms = SweepTerms(config.files_sweep_interval_s, config.files_orphan_grace_s)
        redis = job_client.redis
        # one api of all sweeps the file store (api/files/sweeper.py), keeping the batches' files;
        # its lease is held across the sleep between passes: it lapses only when its holder stops
        lease_s = max(3 * terms.interval_s, 5.0)
        lease = DispatchLease(redis, api_name(), lease_s, keys.FILES_SWEEPER_LEASE, "the file sweeper")
        sweeper = FileSweeper(redis, ctx.files, terms, functools.partial(batch_parts.in_use, redis), lease)
        sweeping = asyncio.create_task(sweeper.run(), name="kvferry-file-sweeper")
        yield
        loops = (dispatcher.task, task, sweeping)
        await stop_tasks(*[t for t in loops if t is not None])  # together, bounded
        await dispatcher.stop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_S):
                await runner.release()
                await sweeper.release()
        await ctx.jobs.close()

    app = FastAPI(title="kvferry", version="0.1.0", lifespan=lifespan)
    app.state.ctx = ctx
    app.state.dispatcher = dispatcher
    install_error_handlers(app)
    app.add_middleware(RequestCounter, metrics=ctx.metrics)
    app.include_router(openai.router)
    app.include_router(responses.router)
    app.include_router(conversations.router)
    app.include_router(jobs.router)
    app.include_router(batches.router)
    app.include_router(ops.router)
    app.include_router(sessions.router)
    app.include_router(tokenize.router)
    app.include_router(files.router)
    openapi_doc.install(app)
    return app


async def secure_store(ctx: ApiContext) -> None:
    """The file store made 0700/0600 (api/files/store.py); a store this user cannot change (a
    volume another owns) is warned of, not fatal."""
    try:
        await asyncio.to_thread(ctx.files.secure)
    except OSError as exc:
        log.warning("the file store %s could not be made private: %s", ctx.config.files_dir, exc)


def create_default_app() -> FastAPI:
    """For `uvicorn --factory api.app:create_default_app` (Redis on localhost, model smollm2)."""
    return create_app(ApiConfig())
