"""ApiContext: what every route needs, built once by create_app and kept on app.state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from api.config import ApiConfig
from api.files.store import FileStore
from api.jobs.client import JobClient
from api.metrics.prometheus import ApiMetrics
from api.metrics.tier import TierReader
from api.routing.memory import RoutingMemory
from api.tenants import KeyRing
from api.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class ApiContext:
    config: ApiConfig
    jobs: JobClient
    metrics: ApiMetrics
    started: int  # unix time the app was built ("created" of /v1/models entries)
    keys: KeyRing
    tier: TierReader
    files: FileStore  # /v1/files contents and the batch runner's files (api/files/store.py)
    tokenizer: Tokenizer | None = None  # /tokenize and /detokenize; None: they answer 503
    routing: RoutingMemory = field(default_factory=RoutingMemory)  # what this api routed lately


async def context(request: Request) -> ApiContext:
    # async: a plain def dependency would run in the thread pool, a hop per request for no I/O
    ctx = request.app.state.ctx
    assert isinstance(ctx, ApiContext)
    return ctx


Ctx = Annotated[ApiContext, Depends(context)]
