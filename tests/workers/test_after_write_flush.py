"""AfterWriteQueue.flush: a stopping worker waits for the turns' bookkeeping queued so far (their
session records and pins) before it exits, at most a bounded time."""

from __future__ import annotations

import threading
import time

from workers.sessions.after_write import AfterWriteQueue


def test_flush_waits_for_the_work_queued_before_it() -> None:
    queue, ran = AfterWriteQueue(), []
    assert queue.flush(0.01), "nothing was ever queued"
    for i in range(3):
        queue.submit(lambda i=i: (time.sleep(0.05), ran.append(i)))
    assert queue.flush(5.0)
    assert ran == [0, 1, 2]


def test_flush_gives_up_after_its_timeout() -> None:
    queue, release = AfterWriteQueue(), threading.Event()
    queue.submit(lambda: release.wait(5.0))
    assert not queue.flush(0.05)
    release.set()
    assert queue.flush(5.0)
