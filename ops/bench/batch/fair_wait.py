"""Fair share's figure for `kvferry bench batch`: tenant B's single requests (one a second)
queue-wait p95 while tenant A has a flood of jobs queued, against B alone (`fair_wait_ratio`).

It runs against a stack already up with two tenants' keys (the caller's), through /v1/jobs. A
job's queue wait is read from Redis: from its submission (its metadata's `created`) to a worker's
engine taking it (its stage times' `submitted`), parked time included.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import redis
from tqdm import tqdm

from broker import keys

WAIT_LIMIT_S = 600.0


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.95 * (len(ordered) - 1))] if ordered else 0.0


class FairWait:
    def __init__(self, api_url: str, rds: redis.Redis, model: str, max_tokens: int = 64) -> None:
        self.client = httpx.Client(base_url=api_url, timeout=60)
        self.rds = rds
        self.model = model
        self.max_tokens = max_tokens

    def submit(self, key: str, max_tokens: int) -> str:
        body = {"model": self.model, "prompt": "Tell me a story.", "max_tokens": max_tokens}
        r = self.client.post(
            "/v1/jobs",
            json={"endpoint": "/v1/completions", "body": body},
            headers={"Authorization": f"Bearer {key}"},
        )
        r.raise_for_status()
        return str(r.json()["id"])

    def queue_wait(self, job_id: str) -> float:
        deadline = time.monotonic() + WAIT_LIMIT_S
        while (taken := self.rds.hget(keys.job_stages(job_id), "submitted")) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} was never started")
            time.sleep(0.05)
        created: Any = self.rds.hget(keys.job_meta(job_id), "created")
        return max(0.0, float(taken) - float(created))

    def singles(self, key: str, count: int, every_s: float, label: str) -> list[float]:
        ids = []
        for _ in tqdm(range(count), desc=label, unit="req", leave=False):
            ids.append(self.submit(key, 16))
            time.sleep(every_s)
        return [self.queue_wait(j) for j in ids]

    def measure(
        self, key_a: str, key_b: str, flood: int = 500, count: int = 10, every_s: float = 1.0
    ) -> dict[str, Any]:
        alone = self.singles(key_b, count, every_s, "B alone")
        flooded = [
            self.submit(key_a, self.max_tokens) for _ in tqdm(range(flood), desc="A's flood", leave=False)
        ]
        loaded = self.singles(key_b, count, every_s, "B beside A's flood")
        for job_id in tqdm(flooded, desc="A's flood cancelled", leave=False):  # it served its purpose
            self.client.delete(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key_a}"})
        out = {
            "flood": flood,
            "b_requests": count,
            "b_alone_p95_s": p95(alone),
            "b_under_flood_p95_s": p95(loaded),
        }
        out["fair_wait_ratio"] = out["b_under_flood_p95_s"] / max(out["b_alone_p95_s"], 1e-3)
        return out
