"""`kvferry chaos` against HF transformers: a sample of the chaos pass's jobs, each checked against
HF `generate` (greedy, at batch 1) on the exact prompt ids the worker used, on the model the stack
served. The fault-free reference pass runs on the same stack, so an engine bug in both passes
would match itself: this check is the one that does not share the engine.

The sample: per session, one turn (its last completed turn whose ids are known, else its first);
per kill, every completed job it hit. A job's output ids come from its final stream event (its
result); its prompt ids from the session's exact tokens (the checkpoint its turn wrote:
broker/sessions/tokens.py) or, where the worker tokenised the request afresh (completions, single
chats, a session's first turn), from the worker's own tokeniser code (workers/jobs/prompt.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from broker import keys
from broker.codec import decode_event
from broker.jobs.events import EVENT_FIELD
from broker.messages import ChatMessage, GenerateJob, GenerateResult, JobDone
from broker.redis.connect import connect
from broker.sessions import store as session_store
from broker.sessions.tokens import SessionTokens
from ops.chaos.clients import JobRecord
from ops.chaos.fault_log import KillEvent
from ops.settings import Settings
from workers.jobs.prompt import prompt_token_ids

EXAMPLES_KEPT = 5
Greedy = Callable[[list[int], int], list[int]]  # (prompt ids, new tokens) -> HF's greedy ids


@dataclass(frozen=True, slots=True)
class Group:
    """Jobs of which at least one must be checked: a session's turns, preferred first (the first
    checkable one is), or a kill's jobs (each checkable one is)."""

    what: str
    jobs: tuple[JobRecord, ...]
    every: bool


@dataclass(frozen=True, slots=True)
class JobIds:
    prompt: list[int]
    output: list[int]


def groups(records: Iterable[JobRecord], kills: Sequence[KillEvent]) -> list[Group]:
    records = [r for r in records if r.status == "completed" and r.job_id]
    sessions: dict[str, list[JobRecord]] = {}
    for r in records:
        if r.request.get("session_id"):
            sessions.setdefault(str(r.request["session_id"]), []).append(r)
    out = [
        # the last turn builds on all before it; the first is the one whose ids are always known
        Group(f"session {sid}", (*sorted(turns, key=_turn, reverse=True),), every=False)
        for sid, turns in sessions.items()
    ]
    by_id = {r.job_id: r for r in records}
    for n, kill in enumerate(kills):
        hit = tuple(by_id[j] for j in kill.jobs if j in by_id)
        if hit:
            out.append(Group(f"kill {n} ({kill.node})", hit, every=True))
    return out


def _turn(record: JobRecord) -> int:
    return sum(m.get("role") == "assistant" for m in record.request.get("messages", ()))


def job_of(record: JobRecord, model: str) -> GenerateJob:
    """The job the api made of the record's request (api/schema/openai.py, to_job)."""
    body = record.request
    messages = tuple(ChatMessage(m["role"], m["content"]) for m in body.get("messages", ()))
    return GenerateJob(
        model=model,
        endpoint="chat" if messages else "completion",
        messages=messages,
        prompt=body.get("prompt") or None,
        session_id=body.get("session_id"),
    )


def ids_of(
    record: JobRecord, result: GenerateResult | None, tokens: SessionTokens | None, tokenizer: Any, model: str
) -> JobIds | str:
    """The prompt and output ids the worker used for the job; a string saying why they are not
    known otherwise. Either way they must agree with the job's own counts (its result's usage)."""
    if result is None:
        return "no final result in its stream"
    out = list(result.token_ids)
    job = job_of(record, model)
    prompt: list[int] | None = None
    if job.session_id and tokens is not None:
        # its turn's checkpoint: the conversation it answered, its reply included
        mark = next(
            (c for c in reversed(tokens.checkpoints) if c.num_messages == len(job.messages) + 1), None
        )
        end = mark.num_tokens if mark is not None else -1
        if end >= len(out) and list(tokens.token_ids[end - len(out) : end]) == out:
            prompt = list(tokens.token_ids[: end - len(out)])
    if prompt is None and (not job.session_id or _turn(record) == 0):
        prompt = prompt_token_ids(job, tokenizer, None)  # tokenised afresh, as the worker did
    if prompt is None:
        return "its session's exact tokens no longer hold this turn"
    usage = result.usage
    if len(prompt) != usage.prompt_tokens or len(out) != usage.completion_tokens:
        counted = f"{usage.prompt_tokens} + {usage.completion_tokens}"
        return f"ids ({len(prompt)} + {len(out)}) disagree with its usage ({counted})"
    return JobIds(prompt, out)


def compare(plan: list[Group], ids: Callable[[JobRecord], JobIds | str], greedy: Greedy) -> dict[str, Any]:
    """Each group's jobs against HF; the report's hf_* figures. A group none of whose jobs could be
    checked is `hf_uncovered` (the sample fell short: the verdict fails)."""
    done: dict[str, bool | str] = {}  # job id -> matched, or why it could not be checked
    examples: list[dict[str, Any]] = []
    uncovered: list[str] = []
    for group in plan:
        checked = 0
        for record in group.jobs:
            job = str(record.job_id)  # a key repeats in every pass of the load; an id never does
            if job not in done:
                found = ids(record)
                if isinstance(found, str):
                    done[job] = f"{record.key} ({job}): {found}"
                else:
                    hf = greedy(found.prompt, len(found.output))
                    done[job] = hf == found.output
                    if hf != found.output and len(examples) < EXAMPLES_KEPT:
                        examples.append(_example(record, found, hf))
            checked += isinstance(done[job], bool)
            if checked and not group.every:
                break
        if not checked:
            uncovered.append(group.what)
    verdicts = [v for v in done.values() if isinstance(v, bool)]
    return {
        "hf_checked": len(verdicts),
        "hf_mismatches": verdicts.count(False),
        "hf_uncovered": uncovered,
        "hf_unverified": sorted(v for v in done.values() if isinstance(v, str)),
        "hf_examples": examples,
    }


def _example(record: JobRecord, found: JobIds, hf: list[int]) -> dict[str, Any]:
    at = next((i for i, (a, b) in enumerate(zip(found.output, hf, strict=False)) if a != b), len(hf))
    return {
        "key": record.key,
        "job_id": record.job_id,
        "worker": record.worker,
        "prompt_tokens": len(found.prompt),
        "diverges_at": at,
        "ours": found.output,
        "hf": hf,
    }


class HFGreedy:
    """HF `generate`, greedy at batch 1, on a copy of the served model (ops/bench/engine/hf_baseline.py)."""

    def __init__(self, settings: Settings) -> None:
        from ops.bench.engine.hf_baseline import hf_model
        from workers.engine.model.loader import load_model

        # the fp32 reference, whatever the served precision
        loaded = load_model(settings.model, "float32", settings.device, settings.cache_dir)
        self.tokenizer = loaded.tokenizer
        self.model = hf_model(loaded)
        # exactly as many tokens as the job made: its EOS, where it stopped at one, is among them
        self.model.generation_config.eos_token_id = None
        self._memo: dict[tuple[tuple[int, ...], int], list[int]] = {}  # repeated passes repeat prompts

    def __call__(self, prompt: list[int], new_tokens: int) -> list[int]:
        from ops.bench.engine.hf_baseline import hf_greedy

        key = (tuple(prompt), new_tokens)
        if key not in self._memo and new_tokens > 0:
            self._memo[key] = hf_greedy(self.model, prompt, new_tokens)
        return self._memo.get(key, [])


def final_result(client: redis.Redis, job_id: str) -> GenerateResult | None:
    """The job's result, from its stream's final event (None: no final event)."""
    last: Any = client.xrevrange(keys.job_stream(job_id), count=1)
    event = decode_event(last[0][1][EVENT_FIELD]) if last else None
    return event.result if isinstance(event, JobDone) else None


def _session_tokens(client: redis.Redis, record: JobRecord) -> SessionTokens | None:
    session_id = record.request.get("session_id")
    if not session_id or not record.job_id:
        return None
    tenant: Any = client.hget(keys.job_meta(record.job_id), "tenant")
    return session_store.load_tokens(client, tenant.decode() if tenant else "", str(session_id))


def hf_check(settings: Settings, records: list[JobRecord], kills: Sequence[KillEvent]) -> dict[str, Any]:
    """The sample (groups()) checked against HF; reads the jobs' results and sessions from the
    stack's Redis, so it runs before the stack stops."""
    plan = groups(records, kills)
    greedy = HFGreedy(settings)
    client = connect(settings.queue_url)
    try:

        def ids(record: JobRecord) -> JobIds | str:
            result = final_result(client, str(record.job_id))
            tokens = _session_tokens(client, record)
            return ids_of(record, result, tokens, greedy.tokenizer, settings.served_model)

        return compare(plan, ids, greedy)
    finally:
        client.close()
