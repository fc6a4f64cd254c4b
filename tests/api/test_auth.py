"""Auth on: a Bearer key is required on /v1 (not on /healthz, nor on /metrics unless it has its own
token); the key names the tenant."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest
import redis

from api.auth import tenant_of
from tests.api.conftest import MODEL, Served
from tests.api.fake_worker import FakeWorker

KEY = "sk-test-123"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def secured(serve: Callable[..., Served], rds: redis.Redis) -> Served:
    return serve(api_key=KEY)


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {KEY}", KEY])
def test_missing_or_wrong_key_is_401(secured: Served, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    with secured.client() as c:
        for r in (
            c.post("/v1/chat/completions", json=BODY, headers=headers),
            c.get("/v1/models", headers=headers),
            c.get("/v1/jobs/x", headers=headers),
        ):
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"


def test_right_key_passes_and_sets_the_tenant(secured: Served, worker: FakeWorker) -> None:
    with secured.client(headers={"Authorization": f"Bearer {KEY}"}) as c:
        assert c.post("/v1/chat/completions", json=BODY).status_code == 200
    assert worker.seen[0].job.tenant == tenant_of(KEY)
    assert KEY not in tenant_of(KEY)


def test_open_routes_need_no_key(secured: Served) -> None:
    with secured.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/metrics").status_code == 200


def test_openai_client_with_key(secured: Served, worker: FakeWorker) -> None:
    good = openai.OpenAI(base_url=f"{secured.url}/v1", api_key=KEY, max_retries=0)
    assert good.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}]).choices
    bad = openai.OpenAI(base_url=f"{secured.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_auth_off_accepts_any_key(api: Served, worker: FakeWorker) -> None:
    with api.client(headers={"Authorization": "Bearer whatever"}) as c:
        assert c.post("/v1/chat/completions", json=BODY).status_code == 200
    assert worker.seen[0].job.tenant == ""


def test_metrics_take_their_own_token_when_one_is_set(serve: Callable[..., Served], rds: redis.Redis) -> None:
    """/metrics names every tenant and its usage: with KVFERRY_METRICS_TOKEN set, only a scraper
    holding that token reads them (a tenant's key is not enough)."""
    served = serve(api_key=KEY, metrics_token="scrape-me")
    with served.client() as c:
        for headers in ({}, {"Authorization": f"Bearer {KEY}"}, {"Authorization": "Bearer scrape-m"}):
            r = c.get("/metrics", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = c.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert r.status_code == 200 and "kvferry" in r.text
        assert c.get("/healthz").status_code == 200  # still open: load balancers probe it
