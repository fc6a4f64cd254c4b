"""A `kvferry chaos` run in a precision other than fp32 (`--dtype bfloat16`, `--quantization
int8`, an int8 KV cache): its jobs' answers are not expected to match the fault-free pass's.

In bf16 a product's rounding depends on the GEMM that computed it, and that depends on the step's
rows (the other jobs of the step) and on which of a prompt's tokens came from a cache: the chaos
pass batches and caches differently from the reference pass, and a redelivered job recomputes
what the killed worker had computed. So a job's answer can differ from the reference with no
fault at all. What faults must still never do is precision-free: lose a job, or stream a token
twice or not at all. Each job's stream is therefore checked against its own final answer, the
text of the result its worker wrote to the job's stream (what every reader of the job gets), and
the fault-free pass's answer is kept as a figure (`agree_with_reference`), as HF fp32's is
(`hf_mismatches`: the precision's own effect, docs/benchmarks.md)."""

from __future__ import annotations

from dataclasses import replace

from broker.redis.connect import connect
from ops.chaos.clients import JobRecord
from ops.chaos.hf import final_result
from ops.settings import Settings


def exact_precision(settings: Settings) -> dict[str, str]:
    """fp32 where the settings leave the precision to its default (auto): the run then checks every
    job token-exact against HF fp32 `generate`; else nothing (the precision asked for is run)."""
    if (settings.dtype, settings.kv_cache_dtype, settings.quantization) == ("auto", "auto", "none"):
        return {"dtype": "float32", "kv_cache_dtype": "float32"}
    return {}


def is_exact_run(settings: Settings) -> bool:
    """The stack computes in fp32 throughout: answers are compared token for token. (A running
    stack, `--api-url`, is taken to compute as these settings say: fp32 only with --dtype float32.)"""
    kv = settings.kv_cache_dtype in ("float32", "auto")
    return settings.dtype == "float32" and kv and settings.quantization == "none"


def own_answers(settings: Settings, records: list[JobRecord]) -> dict[str, JobRecord]:
    """Each completed job of the chaos pass as its own reference, by job id (a key repeats across
    a pass's rounds): its record with the text of the result its worker wrote (a job without one is
    left out, and checked as having no reference)."""
    client = connect(settings.queue_url, socket_timeout=10)
    out: dict[str, JobRecord] = {}
    for record in records:
        if record.status == "completed" and record.job_id is not None:
            result = final_result(client, record.job_id)
            if result is not None:
                out[record.job_id] = replace(record, text=result.text, status="completed")
    return out


def agreement(records: list[JobRecord], references: dict[str, JobRecord]) -> int:
    """Completed jobs whose answer equals the fault-free pass's."""
    return sum(
        r.status == "completed" and (ref := references.get(r.key)) is not None and r.text == ref.text
        for r in records
    )
