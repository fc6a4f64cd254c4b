"""`kvferry bench queue`, part "publish": what sending one job costs the api, with the send-only
result backend it uses (broker/redis/result_backend.py) against Celery's own Redis backend (which
subscribes to each task's result channel, and unsubscribes when its AsyncResult goes). The two
alternate, task by task, against one redis-server and a queue nobody consumes; each sent
task's AsyncResult is dropped at once, as the api drops it."""

from __future__ import annotations

import gc
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from broker.celery_app import BrokerConfig, make_celery
from ops.bench.queue.stages import pct
from ops.redis.server import RedisServer

VOID = "kvferry.bench.void"
BODY = ['{"model": "m", "endpoint": "chat", "messages": [["user", "' + "x" * 400 + '"]]}']


def _send_ms(app: Any) -> float:
    start = time.perf_counter()
    app.send_task("kvferry.generate", args=BODY, task_id=str(uuid.uuid4()), queue=VOID)
    return (time.perf_counter() - start) * 1000


def bench_publish(tasks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvferry-publish-") as tmp, RedisServer(Path(tmp)) as server:
        config = BrokerConfig(redis_url=server.url)
        send_only, celery_own = make_celery(config, send_only=True), make_celery(config)
        times: dict[str, list[float]] = {"send_only": [], "celery_backend": []}
        try:
            for app in (send_only, celery_own):  # connections, the pubsub, the binding lookups
                for _ in range(20):
                    _send_ms(app)
            for _ in range(tasks):
                times["send_only"].append(_send_ms(send_only))
                times["celery_backend"].append(_send_ms(celery_own))
                gc.collect(0)  # the api's AsyncResults go with their request
        finally:
            send_only.close()
            celery_own.close()
    out: dict[str, Any] = {"tasks": tasks}
    for name, values in times.items():
        out[f"publish_{name}_p50_ms"] = pct(values, 50)
        out[f"publish_{name}_p99_ms"] = pct(values, 99)
    out["publish_p50_ratio"] = out["publish_send_only_p50_ms"] / out["publish_celery_backend_p50_ms"]
    return out
