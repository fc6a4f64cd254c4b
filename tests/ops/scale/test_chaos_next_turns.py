"""kvferry chaos --scale-in's next turns: which sessions a drained worker served, and the share of
their history the next turn finds cached (a stand-in client: the figure's arithmetic alone)."""

from __future__ import annotations

import asyncio
from typing import Any

from ops.chaos.clients import JobRecord
from ops.chaos.fault_log import KillEvent
from ops.chaos.next_turns import drained_sessions, next_turn_figures

DRAIN = KillEvent(at=100.0, child="worker1", node="w1@h", jobs=(), back_after_s=5.0)


def turn(session: str, worker: str, ended: float, status: str = "completed", prompt: int = 40) -> JobRecord:
    request = {"messages": [{"role": "user", "content": "hi"}], "session_id": session}
    usage = {"prompt_tokens": prompt, "completion_tokens": 8}
    return JobRecord(f"{session}.t", status=status, worker=worker, ended=ended, request=request, usage=usage)


def test_the_last_turn_of_each_session_the_drained_worker_served() -> None:
    records = [
        turn("a", "w1@h", 90.0),  # a's last turn, on w1, before the drain ended: counts
        turn("b", "w1@h", 90.0),
        turn("b", "w2@h", 95.0),  # b's last turn ran on w2
        turn("c", "w1@h", 120.0),  # after w1 came back: not the drain's
        turn("d", "w1@h", 99.0, status="failed"),
        JobRecord("single", status="completed", worker="w1@h", ended=90.0),  # no session
    ]
    assert [r.request["session_id"] for r in drained_sessions(records, [DRAIN])] == ["a"]
    assert drained_sessions(records, []) == []


class Client:
    def __init__(self, cached: list[int]) -> None:
        self.cached = cached
        self.bodies: list[dict[str, Any]] = []

    async def run_job(self, key: str, path: str, body: dict[str, Any]) -> JobRecord:
        self.bodies.append(body)
        usage = {"prompt_tokens_details": {"cached_tokens": self.cached.pop(0)}}
        return JobRecord(key, status="completed", usage=usage)


def test_the_share_is_cached_over_history_less_one_block() -> None:
    client = Client([32, 16])  # history 48: 32 = 48 - 16 is all of it; 16 is half
    got = asyncio.run(next_turn_figures(client, [turn("a", "w1@h", 1.0), turn("b", "w1@h", 1.0)], 16))  # type: ignore[arg-type]
    assert got["next_turn_sessions"] == 2
    assert got["next_turn_cached_share"] == 0.75
    assert got["next_turn_short"] == [{"session": "b", "history": 48, "cached": 16}]
    assert client.bodies[0]["session_id"] == "a"
    assert client.bodies[0]["messages"][-2] == {"role": "assistant", "content": ""}
