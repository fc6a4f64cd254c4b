"""What other threads send the engine loop thread: typed, dispatched by type."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvstore.tiers.stored_block import StoredBlock
from workers.engine.requests.request import GenerationRequest
from workers.loop.handle import RequestHandle

if TYPE_CHECKING:
    from workers.engine.llm_engine import LLMEngine


@dataclass(frozen=True, slots=True)
class Submit:
    handle: RequestHandle
    request: GenerationRequest


@dataclass(frozen=True, slots=True)
class WarmBlocks:
    """Blocks a task thread fetched from Redis (a prefetch): into the warm tier, before the
    Submit that follows it in the inbox is admitted."""

    blocks: list[StoredBlock]
    at_request: bool = True  # False: a warm start's (LLMEngine.admit_prefetched)


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Call:
    """Run fn(engine) on the loop thread, between steps; its result or error goes to future."""

    fn: Callable[[LLMEngine], Any]
    future: Future[Any]


LoopMessage = Submit | WarmBlocks | Abort | Call
