"""StageClock: when a request passed each stage of the api (unix times), told to a client that asks
for it (`bench queue`) in one response header. Marking costs a clock read; nothing is written to
Redis for it. The worker's own stage times are in keys.job_stages."""

from __future__ import annotations

import time

REQUEST_HEADER = "x-kvferry-stages"  # a request carrying it (any value) gets STAGES_HEADER back
STAGES_HEADER = "X-Kvferry-Stages"  # "name=unix time,name=unix time,...", in stage order


class StageClock:
    __slots__ = ("marks", "wanted")

    def __init__(self, wanted: bool = False) -> None:
        self.wanted = wanted
        self.marks: list[tuple[str, float]] = [("handler", time.time())]

    def mark(self, stage: str) -> None:
        self.marks.append((stage, time.time()))

    def header(self) -> dict[str, str]:
        """The response header, if the client asked for it."""
        if not self.wanted:
            return {}
        return {STAGES_HEADER: ",".join(f"{name}={at:.6f}" for name, at in self.marks)}


def parse_header(value: str) -> dict[str, float]:
    """STAGES_HEADER's value back into {stage: unix time}."""
    out: dict[str, float] = {}
    for item in value.split(","):
        name, _, at = item.partition("=")
        if name and at:
            out[name] = float(at)
    return out
