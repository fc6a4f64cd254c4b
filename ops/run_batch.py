"""Offline batch runner: OpenAI Batch JSONL in, JSONL out, every line batched by one engine."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.schema import json_guard
from api.schema.openai import CompletionRequest, parse_request, response_body
from broker.errors import InvalidRequestError, PromptTooLongError, UnknownModelError
from broker.messages import Usage
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.output import RequestOutput
from workers.jobs.prompt import prompt_token_ids


@dataclass(frozen=True, slots=True)
class BatchLine:
    line_no: int
    custom_id: str | None
    request: CompletionRequest | None = None
    error_code: str | None = None
    error_message: str | None = None


def parse_line(line_no: int, text: str, served_model: str) -> BatchLine:
    try:
        record = json_guard.loads(text)  # bounded depth, no NaN, no lone surrogates
    except InvalidRequestError as exc:
        return BatchLine(
            line_no, None, error_code="invalid_json", error_message=f"line {line_no}: {exc.message}"
        )
    if not isinstance(record, dict):
        return BatchLine(
            line_no, None, error_code="invalid_request", error_message=f"line {line_no}: not an object"
        )
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BatchLine(
            line_no,
            None,
            error_code="invalid_request",
            error_message=f"line {line_no}: 'custom_id' (a non-empty string) is required",
        )
    if record.get("method", "POST") != "POST":
        return BatchLine(
            line_no, custom_id, error_code="invalid_request", error_message="'method' must be POST"
        )
    try:
        request = parse_request(str(record.get("url")), record.get("body"))
        if request.model != served_model:
            raise UnknownModelError(f"model {request.model!r} is not served here (serving {served_model!r})")
    except UnknownModelError as exc:
        return BatchLine(line_no, custom_id, error_code="model_not_found", error_message=exc.message)
    except InvalidRequestError as exc:
        code = exc.code or "invalid_request"  # its own when it has one: unsupported_parameter
        return BatchLine(line_no, custom_id, error_code=code, error_message=exc.message)
    return BatchLine(line_no, custom_id, request)


def _error_record(line: BatchLine) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": line.custom_id,
        "response": None,
        "error": {"code": line.error_code, "message": line.error_message},
    }


def _ok_record(line: BatchLine, out: RequestOutput) -> dict[str, Any]:
    assert line.request is not None and out.finish_reason is not None
    usage = Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
    request_id = uuid.uuid4().hex
    return {
        "id": f"batch_req_{request_id}",
        "custom_id": line.custom_id,
        "response": {
            "status_code": 200,
            "request_id": request_id,
            "body": response_body(line.request, out.text, out.finish_reason, usage),
        },
        "error": None,
    }


@dataclass
class BatchFigures:
    """Fragmentation sampled after every step while blocks are in use (it is 0 once all finish)."""

    steps: int = 0
    fragmentation_sum: float = 0.0
    fragmentation_max: float = 0.0

    def sample(self, engine: LLMEngine) -> None:
        stats = engine.pool.stats()
        if stats.blocks_used:
            self.steps += 1
            self.fragmentation_sum += stats.fragmentation
            self.fragmentation_max = max(self.fragmentation_max, stats.fragmentation)

    @property
    def fragmentation_mean(self) -> float:
        return self.fragmentation_sum / self.steps if self.steps else 0.0


def run_batch(engine: LLMEngine, lines: list[BatchLine]) -> tuple[list[dict[str, Any]], BatchFigures]:
    """Submit every valid line at once, step the engine until all finish; records in input order."""
    records: list[dict[str, Any] | None] = [None] * len(lines)
    pending: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line.request is None:
            records[i] = _error_record(line)
            continue
        try:
            ids = prompt_token_ids(line.request.to_job(), engine.tokenizer)
            rid = f"batch-{i}"
            engine.add_request(rid, ids, line.request.params)
            pending[rid] = i
        except InvalidRequestError as exc:
            code = "context_length_exceeded" if isinstance(exc, PromptTooLongError) else "invalid_request"
            records[i] = _error_record(
                BatchLine(line.line_no, line.custom_id, error_code=code, error_message=exc.message)
            )
    figures = BatchFigures()
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                i = pending.pop(out.request_id)
                records[i] = _ok_record(lines[i], out)
        figures.sample(engine)
    assert not pending and all(r is not None for r in records)
    return [r for r in records if r is not None], figures


def read_lines(path: Path, served_model: str) -> list[BatchLine]:
    with path.open(encoding="utf-8") as f:
        return [parse_line(n, text, served_model) for n, text in enumerate(f, start=1) if text.strip()]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)


def stats_document(engine: LLMEngine, figures: BatchFigures, wall_s: float) -> dict[str, Any]:
    stats = engine.stats()
    pool = stats.pool
    return {
        "model": engine.model_id,
        "block_size": pool.block_size,
        "bytes_per_block": stats.bytes_per_block,
        "pool_blocks_total": pool.blocks_total,
        "pool_blocks_peak_used": pool.blocks_peak_used,
        "pool_bytes_peak_used": pool.blocks_peak_used * stats.bytes_per_block,
        "prefix_cache_queries_tokens": pool.prefix_cache_queries_tokens,
        "prefix_cache_hits_tokens": pool.prefix_cache_hits_tokens,
        "prefix_hit_rate": pool.prefix_hit_rate,
        "fragmentation": figures.fragmentation_mean,
        "fragmentation_max": figures.fragmentation_max,
        "num_steps": stats.num_steps,
        "num_preemptions": stats.num_preemptions,
        "max_batch_seqs": stats.max_batch_seqs,
        "prompt_tokens_computed": stats.prompt_tokens_computed,
        "generation_tokens": stats.generation_tokens,
        "wall_seconds": wall_s,
        "memory_breakdown": stats.memory.to_dict(),
    }
