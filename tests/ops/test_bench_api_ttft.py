"""ops/bench/tiers/api_ttft.py's report: redis_tier says whether the tier was on; api_vs_engine_cached
is the median of its pairs (each API TTFT and the engine's right after it)."""

from __future__ import annotations

from typing import Any

import pytest

from ops.bench.tiers.api_ttft import figures
from ops.settings import Settings


def _api(settings: Settings) -> dict[str, Any]:
    return figures(settings, 3, [0.05, 0.10, 0.20], [0.06, 0.30, 0.22], [1.0, 1.1, 0.9], [1280] * 3)


def test_redis_tier_is_true_only_when_the_tier_is_on() -> None:
    assert _api(Settings())["redis_tier"] is True
    assert _api(Settings(redis_cache_size="0"))["redis_tier"] is False
    assert _api(Settings(redis_cache_size="0M"))["redis_tier"] is False
    assert _api(Settings(warm_cache_size="0"))["redis_tier"] is False  # the tier hangs off the warm one
    assert _api(Settings(enable_prefix_caching=False))["redis_tier"] is False


def test_api_vs_engine_cached_is_the_median_of_its_pairs() -> None:
    out = _api(Settings())
    assert [p["ratio"] for p in out["api_vs_engine_cached_pairs"]] == pytest.approx([1.2, 3.0, 1.1])
    assert out["api_vs_engine_cached"] == pytest.approx(1.2)  # the medians' ratio would be 2.2
    assert out["engine_cached_ttft_s"] == 0.10
