"""Verifying a `kvferry chaos` run: every job against the fault-free reference answer to the same
prompt (greedy), its stream for duplicated and missing tokens, the redelivery delays after each
kill; then the report (a table, and JSON).

A stream's duplicates and gaps are found on its text: the chunks as received, in order, diffed
against the reference answer. A diff's characters are turned into tokens at the reference
answer's characters per token, so a count is 0 exactly when nothing was repeated or dropped.

In a run that does not compute in fp32 the reference is each job's own final answer, and HF's
differences are figures, not failures (own_answers.py)."""

from __future__ import annotations

import difflib
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ops.chaos.clients import JobRecord
from ops.chaos.fault_log import FaultLog

EXAMPLES_KEPT = 5
REDELIVERIES_KEPT = 100
JSON_ONLY = frozenset({"redeliveries", "hf_examples"})  # too long for the table


@dataclass(frozen=True, slots=True)
class JobCheck:
    key: str
    job_id: str | None
    completed: bool
    exact: bool
    duplicated_tokens: int
    missing_tokens: int
    why: str  # empty when exact


def _tokens(chars: int, reference: JobRecord) -> int:
    if chars <= 0:
        return 0
    tokens = int(reference.usage.get("completion_tokens") or len(reference.text))
    per_char = tokens / max(1, len(reference.text))
    return max(1, math.ceil(chars * per_char))


def stream_diff(reference: str, streamed: str, complete: bool) -> tuple[int, int]:
    """(duplicated, missing) characters of a stream against the answer. An incomplete stream
    (it broke and the outcome was polled) may end early: its unstreamed tail is not missing."""
    ops = difflib.SequenceMatcher(None, reference, streamed, autojunk=False).get_opcodes()
    if not complete and ops and ops[-1][0] == "delete":
        ops = ops[:-1]
    extra = sum(j2 - j1 for op, _, _, j1, j2 in ops if op in ("insert", "replace"))
    gone = sum(i2 - i1 for op, i1, i2, _, _ in ops if op in ("delete", "replace"))
    return extra, gone


def check_job(record: JobRecord, reference: JobRecord | None) -> JobCheck:
    completed = record.status == "completed"
    if reference is None or reference.status != "completed":
        return JobCheck(record.key, record.job_id, completed, False, 0, 0, "no reference answer")
    extra, gone = stream_diff(reference.text, record.streamed, record.stream_complete)
    dup, missing = _tokens(extra, reference), _tokens(gone, reference)
    why = ""
    if not completed:
        why = f"{record.status}: {record.error}"
    elif record.text != reference.text:
        why = f"answer differs: {record.text[:60]!r} vs reference {reference.text[:60]!r}"
    elif dup or missing:
        why = f"stream: {dup} duplicated, {missing} missing token(s)"
    return JobCheck(record.key, record.job_id, completed, not why, dup, missing, why)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def redeliveries(records: Iterable[JobRecord], faults: FaultLog) -> list[dict[str, Any]]:
    """Per kill and job it was running: until that job's next token (or, when its stream broke
    and its outcome was polled, its end) reached its client; delay_s None when neither came."""
    by_id = {r.job_id: r for r in records if r.job_id}
    out = []
    for n, kill in enumerate(faults.kills):
        for job_id in kill.jobs:
            record = by_id.get(job_id)
            if record is None:
                continue
            after = [t for t, _, _ in record.chunks if t > kill.at]
            delay = None
            if after:
                delay = after[0] - kill.at
            elif record.ended > kill.at and record.status == "completed":
                delay = record.ended - kill.at
            out.append(
                {
                    "kill": n,
                    "worker": kill.node,
                    "job": record.key,
                    "job_id": job_id,
                    "status": record.status,
                    "delay_s": None if delay is None else round(delay, 3),
                    "worker_after": record.worker,
                }
            )
    return out


def recoveries(records: Iterable[JobRecord], faults: FaultLog) -> list[float]:
    """Per failover: from the primary's SIGKILL until a job submitted after it completed at its
    client (the whole path works again: the api's accept, the new primary, a worker's consumer,
    the stream), the first such job's end."""
    done = [r for r in records if r.status == "completed"]
    out = []
    for failover in faults.failovers:
        after = [r.ended for r in done if r.started > failover.at]
        if after:
            out.append(min(after) - failover.at)
    return out


def recomputed_tokens(usage: Any) -> int | None:
    """The api's count of tokens recomputed after a redelivery, under whatever key holds it."""
    if not isinstance(usage, dict):
        return None
    found = None
    for key, value in usage.items():
        inner = recomputed_tokens(value) if isinstance(value, dict) else None
        if "recomput" in key and isinstance(value, int):
            inner = value
        if inner is not None:
            found = (found or 0) + inner
    return found


def report(
    records: list[JobRecord],
    references: dict[str, JobRecord],
    faults: FaultLog,
    duration_s: float,
    extra: dict[str, Any],
    by_job: bool = False,
) -> dict[str, Any]:
    """The run's figures and verdict. `references` by the records' keys (the fault-free pass's
    answers), or by job id where `by_job` (each job its own: own_answers.py)."""
    submitted = [r for r in records if r.status != "not_submitted"]
    pairs = [(r, references.get(str(r.job_id) if by_job else r.key)) for r in submitted]
    checks = [check_job(r, reference) for r, reference in pairs]
    hit = redeliveries(submitted, faults)
    delays = [h["delay_s"] for h in hit if h["delay_s"] is not None]
    redelivered = {j for k in faults.kills for j in k.jobs}
    recomputed = [recomputed_tokens(r.usage) for r in submitted if r.job_id in redelivered]
    known = [n for n in recomputed if n is not None]
    back = [k.back_after_s for k in faults.kills]
    recovered = recoveries(submitted, faults)
    out = {
        "jobs": len(records),  # never-submitted ones too: each is a job the run did not do
        "completed": sum(c.completed for c in checks),
        "exact": sum(c.exact for c in checks),
        "duplicated_tokens": sum(c.duplicated_tokens for c in checks),
        "missing_tokens": sum(c.missing_tokens for c in checks),
        "lost": sum(r.status == "lost" for r in submitted),
        "failed": sum(r.status == "failed" for r in submitted),
        "not_submitted": len(records) - len(submitted),
        "resubmissions": sum(r.submit_attempts - 1 for r in records),
        "kills": len(faults.kills),
        "kills_that_hit_jobs": sum(bool(k.jobs) for k in faults.kills),
        "redis_restarts": len(faults.redis_restarts),
        "failovers": len(faults.failovers),
        "kv_shard_kills": len(faults.kv_shard_kills),
        "scale_ins": len(faults.scale_ins),  # drained workers: each must exit 0
        "drain_exit_codes": faults.drain_exit_codes,
        "promotion_p50_s": _median([f.promoted_after_s for f in faults.failovers]),
        "recovery_p50_s": _median(recovered),
        "recovery_max_s": round(max(recovered), 3) if recovered else None,
        # jobs the api accepted (it answered with their id) that never completed
        "accepted_lost": sum(r.job_id is not None and r.status != "completed" for r in submitted),
        "jobs_hit_by_kills": len(redelivered),
        "redelivery_p50_s": _median(delays),
        "redelivery_max_s": round(max(delays), 3) if delays else None,
        "recomputed_tokens": sum(known) if known else None,
        "worker_restart_p50_s": _median(back),
        "unexpected_exits": faults.unexpected_exits,
        "notes": faults.notes,
        "faults": faults.events,
        "duration_s": round(duration_s, 1),
        **extra,
        "redeliveries": hit[:REDELIVERIES_KEPT],
        "examples": [_example(c, *pair) for c, pair in zip(checks, pairs, strict=True) if not c.exact][
            :EXAMPLES_KEPT
        ],
    }
    failures = verdict(out)
    return {"passed": not failures, "failures": failures, **out}


def verdict(result: dict[str, Any]) -> list[str]:
    """Why the run fails; empty when it passes. A figure the run did not measure fails it too."""
    failures: list[str] = []

    def need(ok: object, why: str) -> None:
        if not ok:
            failures.append(why)

    jobs, completed, exact = result["jobs"], result["completed"], result["exact"]
    need(jobs > 0, "no jobs ran")
    for key in ("lost", "failed", "not_submitted"):  # never submitted: as good as lost
        need(result[key] == 0, f"{result[key]} job(s) {key.replace('_', ' ')}")
    need(exact == completed == jobs, f"of {jobs} jobs, {completed} completed, {exact} exact")
    need(result["duplicated_tokens"] == result["missing_tokens"] == 0, "streams repeated or dropped tokens")
    raw = (result.get("raw_duplicated_tokens"), result.get("raw_duplicated_finals"))
    need(raw == (0, 0), f"raw streams held repeated tokens or finals: {raw}")
    need(not result["unexpected_exits"], f"unexpected exits: {result['unexpected_exits']}")
    need(
        not result.get("engine_step_failures"), f"{result.get('engine_step_failures')} engine step(s) failed"
    )
    integrity = result.get("integrity_ok") or {}
    need(integrity, "no worker answered the pool integrity check")
    need(all(integrity.values()), f"pool integrity failed: {[n for n, ok in integrity.items() if not ok]}")
    need(not result["kills"] or result["jobs_hit_by_kills"], f"{result['kills']} kill(s) hit no job")
    need(
        all(c == 0 for c in result["drain_exit_codes"]),
        f"drained workers exited {result['drain_exit_codes']}",
    )
    need(not result.get("accepted_lost"), f"{result.get('accepted_lost')} accepted job(s) never completed")
    failovers = result.get("failovers") or 0
    need(
        not failovers or result.get("recovery_p50_s") is not None,
        f"no job completed after any of the {failovers} failover(s)",
    )
    need("hf_checked" in result, f"not checked against HF generate: {result.get('hf_error', 'not run')}")
    need(result.get("hf_checked", 1) or not completed, "no job checked against HF generate")
    exact_run = result.get("exact_run", True)  # else the precision's own differences (own_answers.py)
    need(exact_run or "agree_with_reference" in result, "no agreement with the fault-free pass counted")
    need(
        not exact_run or not result.get("hf_mismatches"),
        f"{result.get('hf_mismatches')} job(s) differ from HF generate",
    )
    need(not result.get("hf_uncovered"), f"no job checked against HF for: {result.get('hf_uncovered')}")
    return failures


def _example(check: JobCheck, record: JobRecord | None, reference: JobRecord | None) -> dict[str, Any]:
    """A job that was not exact, with what tells where to look: the worker that answered, its
    usage (where its prompt's KV came from) and the fault-free pass's."""
    out: dict[str, Any] = {"key": check.key, "job_id": check.job_id, "why": check.why}
    if record is not None:
        out.update(worker=record.worker, submits=record.submit_attempts, usage=record.usage)
    if reference is not None:
        out.update(reference_worker=reference.worker, reference_usage=reference.usage)
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 100 else f"{value:.0f}"
    return str(value)


def render(result: dict[str, Any]) -> str:
    """The report as a two-column table (lists and per-worker figures on lines of their own)."""
    rows = [(k, v) for k, v in result.items() if not isinstance(v, (list, dict))]
    width = max(len(k) for k, _ in rows)
    lines = [f"{'figure':<{width}}  value", f"{'-' * width}  -----"]
    lines += [f"{k:<{width}}  {_cell(v)}" for k, v in rows]
    for key, value in result.items():
        if key in JSON_ONLY:
            continue
        if isinstance(value, dict) and value:
            lines.append(f"{key}:")
            lines += [f"  {name}: {figures}" for name, figures in sorted(value.items())]
        elif isinstance(value, list) and value:
            lines.append(f"{key}:")
            lines += [f"  {item}" for item in value]
    return "\n".join(lines)
