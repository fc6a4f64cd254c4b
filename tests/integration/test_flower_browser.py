"""Flower's worker page as an operator sees it, in headless Chromium: the kvferry KV figures are
rows of flat fields with their units (workers/process/flower_fields.py), not a JSON blob. A
screenshot of the page is saved as a test artifact (KVFERRY_TEST_ARTIFACTS, default
test-artifacts/). Chromium and its driver come from Debian (`chromium`, `chromium-driver`; .ci/run
installs them); without them the test is skipped locally, and fails in CI (CI set)."""

from __future__ import annotations

import base64
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.redis.server import RedisServer
from tests.integration.conftest import ROOT, WorkerProcess, wait_for
from tests.integration.test_flower import AUTH, running_flower

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
UNITS = {  # field -> what its value must look like
    "kvferry.kv_pool_used": r"\d+ / [1-9]\d* blocks \(\d+\.\d %\)",
    "kvferry.kv_pool_size": r"\d+\.\d MiB \(\d+ bytes a block\)",
    "kvferry.prefix_hit_rate": r"\d+\.\d % of \d+ prompt tokens",
    "kvferry.seqs_running": r"\d+ / \d+ seqs",
    "kvferry.weights": r"\d+\.\d MiB",
    "kvferry.warm_start": r"\d+ blocks \(\d+\.\d MiB\)",
}


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None or DRIVER is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium and chromium-driver (.ci/run)")
        pytest.skip("no chromium / chromedriver (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1600"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_flowers_worker_page_shows_the_kv_figures_with_units(
    browser: Any,
    redis_server: RedisServer,
    worker_factory: Callable[..., WorkerProcess],
) -> None:
    from selenium.webdriver.common.by import By

    worker = worker_factory("flower-page")
    with running_flower(redis_server.url) as url:
        token = base64.b64encode(":".join(AUTH).encode()).decode()
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
        )
        browser.get(f"{url}/worker/{worker.name}")
        wait_for(lambda: browser.find_elements(By.ID, "worker-tab-other"), 30, "the worker page")
        assert browser.find_element(By.ID, "workername").text == worker.name
        browser.find_element(By.ID, "worker-tab-other").click()
        pane = browser.find_element(By.ID, "tab-other")
        wait_for(pane.is_displayed, 10, "the worker's other statistics")
        rows = {}
        for tr in pane.find_elements(By.CSS_SELECTOR, "tr"):
            cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            if len(cells) == 2:
                rows[cells[0]] = cells[1]
        artifacts = Path(os.environ.get("KVFERRY_TEST_ARTIFACTS", ROOT / "test-artifacts"))
        artifacts.mkdir(parents=True, exist_ok=True)
        shot = artifacts / "flower-worker-page.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    assert rows.get("kvferry.model") == "tiny", rows
    assert rows.get("kvferry.queue") == worker.queue
    for field, shape in UNITS.items():
        assert re.fullmatch(shape, rows.get(field, "")), (field, rows.get(field))
    assert not any(v.lstrip().startswith("{") for k, v in rows.items() if k.startswith("kvferry."))
