"""Prefetch ahead of the turn, measured: a session's turn moves to a worker that never saw it (its
last worker is gone or busy) and waits there behind a backlog; with a hint the worker loads the
session's blocks from Redis while the turn waits, without one the turn fetches them when it
starts. TTFT from submission (backlog included) and from the job's start (fetch + prefill)."""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from broker import keys
from broker.celery_app import BrokerConfig, make_celery
from broker.codec import decode_result, encode_job
from broker.messages import ChatMessage, GenerateJob, GenerateResult
from broker.redis.connect import connect
from broker.routing import prefetch_hint
from broker.sampling import SamplingParams
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack


def _send(app: Any, job: GenerateJob, queue: str) -> Any:
    return app.send_task(keys.GENERATE_TASK, args=[encode_job(job)], task_id=str(uuid.uuid4()), queue=queue)


def _chat(model: str, messages: tuple[ChatMessage, ...], session: str | None, max_tokens: int) -> GenerateJob:
    return GenerateJob(
        model=model,
        endpoint="chat",
        messages=messages,
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        session_id=session,
        submitted_at=time.time(),
    )


def bench_prefetch(
    settings: Settings, run_dir: Path, trials: int = 3, history_words: int = 600, backlog: int = 2
) -> dict[str, Any]:
    """Alternating trials with and without a hint, each with a fresh session of ~history_words
    words, its turn queued behind `backlog` jobs on a worker running one job at a time."""
    stack_settings = settings.with_overrides(api_port=free_port(), torch_threads=1, worker_concurrency=1)
    rows: list[dict[str, Any]] = []
    with Stack(stack_settings, 2, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()
        url = stack.settings.queue_url
        client = connect(url)
        app = make_celery(BrokerConfig(redis_url=url))
        names = sorted(k.decode().split(":")[2] for k in client.scan_iter(match="kvferry:worker:*:heartbeat"))
        first, second = names[0], names[1]
        model = settings.served_model
        for trial in range(2 * trials):
            hinted = trial % 2 == 0
            sid = f"prefetch-{trial}-{uuid.uuid4().hex[:6]}"
            words = " ".join(f"fact{trial}-{i}" for i in range(history_words))
            turn1 = (ChatMessage("system", f"Remember: {words}"), ChatMessage("user", "Ready?"))
            r1 = decode_result(_send(app, _chat(model, turn1, sid, 8), keys.worker_queue(first)).get(600))
            fillers = [
                _send(
                    app,
                    _chat(model, (ChatMessage("user", f"filler {trial}.{i}"),), None, 24),
                    keys.worker_queue(second),
                )
                for i in range(backlog)
            ]
            turn2 = (*turn1, ChatMessage("assistant", r1.text), ChatMessage("user", "What was fact 7?"))
            handle = _send(app, _chat(model, turn2, sid, 4), keys.worker_queue(second))
            if hinted:  # what api/routing/router.py sends when the session's turn moves
                hint = prefetch_hint.PrefetchHint("", sid, "")
                client.lpush(keys.worker_prefetch(second), prefetch_hint.encode(hint))
            for f in fillers:
                f.get(600)
            r2: GenerateResult = decode_result(handle.get(600))
            rows.append(
                {
                    "hinted": hinted,
                    "prompt_tokens": r2.usage.prompt_tokens,
                    "cached_tokens": r2.usage.cached_tokens,
                    "redis_tokens": r2.usage.redis_tokens,
                    "ttft_s": r2.ttft_s,
                    "queue_wait_s": r2.queue_wait_s,
                    "start_to_first_token_s": r2.ttft_s - r2.queue_wait_s,
                }
            )
        client.close()

    def mean(hinted: bool, field: str) -> float:
        return statistics.fmean(r[field] for r in rows if r["hinted"] is hinted)

    return {
        "trials": rows,
        "ttft_hinted_s": mean(True, "ttft_s"),
        "ttft_unhinted_s": mean(False, "ttft_s"),
        "start_to_first_token_hinted_s": mean(True, "start_to_first_token_s"),
        "start_to_first_token_unhinted_s": mean(False, "start_to_first_token_s"),
        "prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in rows),
    }


if __name__ == "__main__":  # python -m ops.bench.tiers.prefetch: a stand-alone run, prints its JSON
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvferry-prefetch-") as tmp:
        print(json.dumps(bench_prefetch(Settings(), Path(tmp)), indent=2))
