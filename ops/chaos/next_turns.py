"""What a scale-in costs the sessions of the drained worker: after the chaos pass, each session
whose last turn that worker served (ending before its drain did) sends one more turn, as its
client would, and the turn's cached tokens are weighed against its history (issue 43: cached
>= history - one block, since a turn's last partial block is not shared).

    next_turn_cached_share = mean over those sessions of min(1, cached / (history - block_size))

history: the last turn's prompt and completion tokens, i.e. everything the drained worker held."""

from __future__ import annotations

from typing import Any

from ops.chaos.clients import ChaosClient, JobRecord
from ops.chaos.fault_log import KillEvent


def drained_sessions(records: list[JobRecord], scale_ins: list[KillEvent]) -> list[JobRecord]:
    """Each session's last completed turn, where a worker drained after serving it."""
    last: dict[str, JobRecord] = {}
    for record in records:
        session = record.request.get("session_id")
        fresher = session not in last or record.ended > last[session].ended
        if session and record.status == "completed" and fresher:
            last[session] = record
    return [
        r
        for r in last.values()
        if any(r.worker == e.node and r.ended <= e.at + e.back_after_s for e in scale_ins)
    ]


async def next_turn_figures(client: ChaosClient, turns: list[JobRecord], block_size: int) -> dict[str, Any]:
    shares: list[float] = []
    short: list[dict[str, Any]] = []
    for prev in turns:
        messages = [*prev.request["messages"], {"role": "assistant", "content": prev.text}]
        messages.append({"role": "user", "content": "and then?"})
        body = {"messages": messages, "session_id": prev.request["session_id"]}
        record = await client.run_job(f"{prev.key}.next", "/v1/chat/completions", body)
        if record.status != "completed":
            shares.append(0.0)
            short.append({"session": body["session_id"], "status": record.status})
            continue
        history = int(prev.usage.get("prompt_tokens", 0)) + int(prev.usage.get("completion_tokens", 0))
        cached = int(record.usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))
        shares.append(min(1.0, cached / max(1, history - block_size)))
        if cached < history - block_size:
            short.append({"session": body["session_id"], "history": history, "cached": cached})
    return {
        "next_turn_sessions": len(turns),
        "next_turn_cached_share": round(sum(shares) / len(shares), 3) if shares else None,
        "next_turn_short": short[:20],
    }
