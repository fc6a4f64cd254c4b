"""The load of `kvferry chaos`: a fixed, seeded workload (multi-turn sessions and single chat and
completion jobs, greedy) and streaming HTTP clients that record every chunk they receive.

A client retries a request it could not submit (connection refused, 5xx without a job id, as
during a Redis restart): such a job is "not submitted", never "lost". Once it holds the job's id
(the X-Job-Id header) and its stream breaks, it polls GET /v1/jobs/{id} for the outcome."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

# fmt: off
WORDS = (
    "river", "stone", "lamp", "winter", "orange", "ladder", "cloud", "violin", "garden", "engine",
    "paper", "silver", "window", "harbour", "meadow", "candle", "rocket", "pepper", "forest",
    "marble", "tunnel", "copper", "island", "feather", "basket",
)
# fmt: on
SYSTEM = (
    "You are a patient assistant for a small shop. Answer briefly and politely, in plain words, "
    "and never in lists."
)
SUBMIT_TRIES = 40  # a Redis restart takes a second or two: this outlasts it many times over
POLL_EVERY_S = 0.25


@dataclass(frozen=True, slots=True)
class Script:
    """What one client does in one round: a session of `turns` chat turns, or one job."""

    key: str  # stable across the reference and the chaos run: "c3.r1.session"
    kind: str  # "session" | "chat" | "completion"
    prompts: tuple[str, ...]  # the user's turns (one for a single job)


@dataclass
class JobRecord:
    """One job as its client saw it. Times are time.monotonic() in this process."""

    key: str  # script key + turn: "c3.r1.session.t2"
    job_id: str | None = None
    status: str = "not_submitted"  # "completed" | "failed" | "lost" | "not_submitted"
    chunks: list[tuple[float, int, str]] = field(default_factory=list)  # (time, char index, text)
    stream_complete: bool = False  # the stream reached its finish_reason and [DONE]
    text: str = ""  # the answer: the stream's, or GET /v1/jobs/{id}'s when the stream broke
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    worker: str = ""
    submit_attempts: int = 0
    error: str = ""
    started: float = 0.0
    ended: float = 0.0
    request: dict[str, Any] = field(default_factory=dict)  # what the client asked (messages or prompt)

    @property
    def streamed(self) -> str:
        return "".join(text for _, _, text in self.chunks)


def make_scripts(clients: int, rounds: int, turns: int, words: int, seed: int) -> list[list[Script]]:
    """scripts[client][n]: every client's rounds, each a session and a chat and a completion job."""
    out: list[list[Script]] = []
    for c in range(clients):
        mine: list[Script] = []
        for r in range(rounds):
            rng = random.Random(f"{seed}.{c}.{r}")

            def sentence(rng: random.Random = rng) -> str:
                return " ".join(rng.choice(WORDS) for _ in range(words)) + "?"

            base = f"c{c}.r{r}"
            mine.append(Script(f"{base}.session", "session", tuple(sentence() for _ in range(turns))))
            mine.append(Script(f"{base}.chat", "chat", (sentence(),)))
            mine.append(Script(f"{base}.completion", "completion", (sentence(),)))
        out.append(mine)
    return out


@dataclass(frozen=True, slots=True)
class LoadConfig:
    model: str
    max_tokens: int
    api_key: str | None = None
    # A job with no outcome by then is lost. It also bounds every read: the api sends a stream's
    # headers only with the job's first event, and a client that gave up on them and sent again
    # would make a second job.
    job_timeout_s: float = 300.0


class ChaosClient:
    """One HTTP client shared by every simulated user; each script runs in its own task."""

    def __init__(self, base_url: str, config: LoadConfig, concurrency: int) -> None:
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        timeout = httpx.Timeout(config.job_timeout_s, connect=5.0)
        limits = httpx.Limits(max_connections=concurrency + 4)
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits, headers=headers)
        self.config = config

    async def close(self) -> None:
        await self.http.aclose()

    async def run_script(self, script: Script, session_id: str) -> list[JobRecord]:
        """A session's turns build on its own answers, as a real client's would."""
        records: list[JobRecord] = []
        history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        for turn, prompt in enumerate(script.prompts):
            key = f"{script.key}.t{turn}"
            body: dict[str, Any]
            if script.kind == "completion":
                path, body = "/v1/completions", {"prompt": prompt}
            else:
                history.append({"role": "user", "content": prompt})
                path, body = "/v1/chat/completions", {"messages": list(history)}
                if script.kind == "session":
                    body["session_id"] = session_id
            record = await self.run_job(key, path, body)
            records.append(record)
            if record.status != "completed":
                break  # the next turn would build on an answer we do not have
            history.append({"role": "assistant", "content": record.text})
        return records

    async def run_job(self, key: str, path: str, body: dict[str, Any]) -> JobRecord:
        body = {
            **body,
            "model": self.config.model,
            "temperature": 0,
            "max_tokens": self.config.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        record = JobRecord(key, started=time.monotonic(), request=body)
        deadline = record.started + self.config.job_timeout_s
        for attempt in range(SUBMIT_TRIES):
            record.submit_attempts = attempt + 1
            try:
                retry = await self._stream(path, body, record, deadline)
            except httpx.TransportError as exc:
                record.error = f"{type(exc).__name__}: {exc}"
                retry = record.job_id is None
            if not retry or time.monotonic() > deadline:
                break
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        if record.job_id is not None and record.status not in ("completed", "failed"):
            await self._poll(record, deadline)
        record.ended = time.monotonic()
        return record

    async def _stream(self, path: str, body: dict[str, Any], record: JobRecord, deadline: float) -> bool:
        """One try; True when it should be tried again (it was not submitted)."""
        async with self.http.stream("POST", path, json=body) as response:
            record.job_id = response.headers.get("x-job-id") or None
            record.worker = response.headers.get("x-kvferry-worker", "")
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                record.error = f"HTTP {response.status_code}: {text}"
                if record.job_id is None:
                    return response.status_code >= 500 or response.status_code == 429
                record.status = "failed" if response.status_code < 500 else record.status
                return False
            record.status = "lost"  # until its outcome is known
            async for line in response.aiter_lines():
                if self._line(line, record) or time.monotonic() > deadline:
                    break
            return False

    @staticmethod
    def _line(line: str, record: JobRecord) -> bool:
        """Handle one SSE line; True at the end of the stream."""
        if not line.startswith("data: "):
            return False
        if line == "data: [DONE]":
            if record.finish_reason is not None:
                record.stream_complete = True
                record.status = "completed"
                record.text = record.streamed
            return True
        chunk = json.loads(line[6:])
        if "error" in chunk:
            record.error = json.dumps(chunk["error"])[:300]
            return True  # the outcome comes from polling the job
        if chunk.get("usage"):
            record.usage = chunk["usage"]
        record.worker = chunk.get("x_kvferry", {}).get("worker", record.worker)
        for choice in chunk.get("choices") or ():
            text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if text:
                record.chunks.append((time.monotonic(), len(record.streamed), text))
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]
        return False

    async def _poll(self, record: JobRecord, deadline: float) -> None:
        """The stream broke after the job was queued: its outcome, from GET /v1/jobs/{id}."""
        record.status = "lost"
        while time.monotonic() < deadline:
            try:
                response = await self.http.get(f"/v1/jobs/{record.job_id}")
                view = response.json() if response.status_code == 200 else {}
            except (httpx.TransportError, ValueError):
                view = {}
            status = view.get("status")
            if status == "succeeded":
                choice = view["result"]["choices"][0]
                record.text = choice.get("text") or choice.get("message", {}).get("content") or ""
                record.finish_reason = choice.get("finish_reason")
                record.usage = view.get("usage") or record.usage
                record.worker = view.get("worker") or record.worker
                record.status = "completed"
                return
            if status in ("failed", "cancelled"):
                record.status = "failed"
                record.error = f"{status}: {json.dumps(view.get('error'))[:300]}"
                return
            await asyncio.sleep(POLL_EVERY_S)


async def run_load(
    client: ChaosClient,
    scripts: list[list[Script]],
    keep_going: Callable[[], bool],
    max_passes: int,
    tag: str,
) -> list[JobRecord]:
    """Each client runs its scripts in order, then again (fresh session ids) while keep_going()
    says so, at most max_passes times over. Repeats use the same prompts: one reference covers them."""
    records: list[JobRecord] = []

    async def one_client(c: int) -> None:
        for n in range(max_passes):
            for script in scripts[c]:
                records.extend(await client.run_script(script, f"{tag}-{script.key}-p{n}"))
            if not keep_going():
                return

    await asyncio.gather(*(one_client(c) for c in range(len(scripts))))
    return records
