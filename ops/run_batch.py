"""Offline batch runner: OpenAI Batch JSONL in, JSONL out, every line batched by one engine. Its
lines are parsed as the online batch runner parses them (api/batches/lines.py)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.batches import lines as batch_lines
from api.batches.lines import BatchLine
from api.schema.answer.bodies import Choice, best_of, response_body
from api.schema.answer.usage import fan_in_usage
from api.schema.openai import CompletionRequest
from broker.errors import InvalidRequestError, PromptTooLongError
from broker.messages import Usage
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.logprob import Logprob
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.jobs.logprob_text import LogprobText
from workers.jobs.prompt import prompt_token_ids


def parse_line(line_no: int, text: str, served_model: str) -> BatchLine:
    return batch_lines.parse_line(line_no, text, batch_lines.served_parse(served_model))


def _error_record(line: BatchLine) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": line.custom_id,
        "response": None,
        "error": {"code": line.error_code, "message": line.error_message},
    }


@dataclass
class _Running:
    """One engine request of a line (a prompt's candidate choice): its prompt, and the logprobs
    its outputs carried so far."""

    line: int
    group: int
    prompt_ids: list[int]
    logprobs: list[Logprob] = field(default_factory=list)
    prompt_logprobs: tuple[Logprob, ...] = ()
    out: RequestOutput | None = None


def _choice(request: CompletionRequest, run: _Running, names: LogprobText) -> Choice:
    out = run.out
    assert out is not None and out.finish_reason is not None
    prompt_text = ""
    if request.echo:
        prompt = request.prompt
        prompt_text = prompt if isinstance(prompt, str) else names.tokenizer.decode(run.prompt_ids)
    return Choice(
        out.text,
        out.finish_reason,
        names.entries(run.logprobs),
        names.prompt(run.prompt_ids, run.prompt_logprobs) if run.prompt_logprobs else (),
        prompt_text,
    )


def _ok_record(line: BatchLine, runs: list[_Running], names: LogprobText) -> dict[str, Any]:
    """A line's answer: a choice per prompt and choice (the n best of best_of), one usage."""
    request = line.request
    assert request is not None
    groups: list[list[_Running]] = []
    for run in runs:
        if run.group == len(groups):
            groups.append([])
        groups[run.group].append(run)
    choices = [c for group in groups for c in best_of(request, [_choice(request, r, names) for r in group])]
    usage = fan_in_usage([[_usage(r.out) for r in group] for group in groups])
    request_id = uuid.uuid4().hex
    return {
        "id": f"batch_req_{request_id}",
        "custom_id": line.custom_id,
        "response": {
            "status_code": 200,
            "request_id": request_id,
            "body": response_body(request, choices, usage),
        },
        "error": None,
    }


def _usage(out: RequestOutput | None) -> Usage:
    assert out is not None
    return Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)


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
    """Submit every valid line at once (a request per prompt and candidate choice), step the
    engine until all finish; records in input order."""
    records: list[dict[str, Any] | None] = [None] * len(lines)
    runs: dict[str, _Running] = {}
    per_line: dict[int, list[_Running]] = {}
    names = LogprobText(engine.served.tokenizer)
    for i, line in enumerate(lines):
        if line.request is None:
            records[i] = _error_record(line)
            continue
        added: list[str] = []
        try:
            for g, group in enumerate(line.request.split()):
                for c, request in enumerate(group):
                    ids = prompt_token_ids(request.to_job(), engine.served.tokenizer)
                    rid = f"batch-{i}-{g}-{c}"
                    engine.add_request(GenerationRequest(rid, ids, request.params))
                    added.append(rid)
                    runs[rid] = _Running(i, g, ids)
        except InvalidRequestError as exc:
            for rid in added:  # all of a line, or none of it
                engine.abort_request(rid)
                del runs[rid]
            code = "context_length_exceeded" if isinstance(exc, PromptTooLongError) else "invalid_request"
            records[i] = _error_record(
                BatchLine(line.line_no, line.custom_id, error_code=code, error_message=exc.message)
            )
            continue
        per_line[i] = [runs[rid] for rid in added]
    figures = BatchFigures()
    left = {i: len(rs) for i, rs in per_line.items()}
    while engine.has_unfinished():
        for out in engine.step():
            run = runs.get(out.request_id)
            if run is None:  # an aborted line's request
                continue
            run.logprobs.extend(out.delta_logprobs)
            run.prompt_logprobs = run.prompt_logprobs or out.prompt_logprobs
            if out.finished:
                run.out = out
                left[run.line] -= 1
                if not left[run.line]:
                    records[run.line] = _ok_record(lines[run.line], per_line[run.line], names)
        figures.sample(engine)
    assert all(r is not None for r in records)
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
        "model": engine.served.model_id,
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
