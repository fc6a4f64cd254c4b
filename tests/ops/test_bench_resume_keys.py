"""`kvferry bench tiers`' resume keys name the history length they measured (a quick run's 1,024
is never reported under the full run's 2,048 names), and fetch_vs_raw_mget's baseline keeps as
many MGETs in flight, on as many connections, as the tier's fetch."""

from __future__ import annotations

import threading
import time
from typing import Any

from ops.bench.tiers.resume import raw_mgets
from ops.bench.tiers.resume_figures import headline, headline_keys, summary

FULL_KEYS = {"resume_ratio_2048", "fetch_mb_s", "fetch_vs_raw_mget", "stages_mb_s"}


def _rows(lengths: list[int]) -> list[dict[str, Any]]:
    return [{"history_tokens": n, "ratio": n / 4096, "fetch_mb_s": float(n)} for n in lengths]


STAGES = {"network_parse_mb_s": 500.0, "network_parse_concurrent_mb_s": 800.0}


def test_quick_resume_keys_name_the_length_they_measured() -> None:
    quick = summary(_rows([64, 256, 1024]), STAGES, 1024, 1, "exact")
    assert not FULL_KEYS & quick.keys(), quick.keys()
    assert quick["resume_ratio_1024"] == 1024 / 4096 and quick["fetch_mb_s_1024"] == 1024.0
    assert quick["stages_mb_s_1024"] == STAGES and quick["headline_tokens"] == 1024
    lifted = headline(quick)
    assert set(lifted) == {
        "resume_ratio_1024",
        "fetch_mb_s_1024",
        "fetch_vs_raw_mget_1024",
        "loading_pays_from_tokens",
    }
    assert set(headline_keys(1024).values()) == {f"{k}_1024" for k in headline_keys(1024)}


def test_full_resume_keys_stay_as_issues_name_them() -> None:
    full = summary(_rows([16, 1024, 2048]), STAGES, 2048, 5, "exact")
    assert full.keys() >= FULL_KEYS
    assert full["resume_ratio_2048"] == 0.5 and full["fetch_mb_s"] == 2048.0
    assert set(headline(full)) == {
        "resume_ratio_2048",
        "fetch_mb_s",
        "fetch_vs_raw_mget",
        "loading_pays_from_tokens",
    }


def test_fetch_vs_raw_mget_is_against_as_many_mgets_in_flight() -> None:
    full = summary(_rows([2048]), STAGES, 2048, 1, "exact")
    assert full["fetch_vs_raw_mget"] == 2048.0 / 800.0  # the concurrent baseline, not the serial one


class _Client:
    """mget() that records how many calls overlap, and on which threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0
        self.threads: set[int] = set()

    def mget(self, keys: list[bytes]) -> list[bytes]:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.threads.add(threading.get_ident())
        time.sleep(0.05)
        with self.lock:
            self.now -= 1
        return [k + b"!" for k in keys]


def test_raw_mgets_keep_that_many_in_flight_in_order() -> None:
    client = _Client()
    chunks = [[b"a", b"b"], [b"c", b"d"], [b"e"], [b"f", b"g"]]
    values, seconds = raw_mgets(client, chunks, 2)  # type: ignore[arg-type]
    assert values == [b"a!", b"b!", b"c!", b"d!", b"e!", b"f!", b"g!"]
    assert client.peak == 2 and len(client.threads) == 2 and seconds > 0
    serial = _Client()
    raw_mgets(serial, chunks, 1)  # type: ignore[arg-type]
    assert serial.peak == 1
