"""A real redis-server per session, a fake worker per test, and the api served by uvicorn in a
thread on a free port."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import uvicorn
from celery import Celery
from fastapi import FastAPI

from api.app import create_app
from api.config import ApiConfig
from api.tokenizer import Tokenizer
from broker import keys
from broker.celery_app import BrokerConfig, make_celery
from ops.redis.server import RedisServer, free_port
from ops.tokenizer import HFTokenizer
from tests.api.fake_worker import FakeWorker
from workers.engine.model.loader import LoadedModel

MODEL = "smollm2"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(scope="session")
def private_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server no running app uses: the `serve` apps' dispatchers and batch runners poll
    the shared one, which would release a test's parked jobs or add to a count of commands."""
    with RedisServer(tmp_path_factory.mktemp("private-redis")) as server:
        yield server.url


@pytest.fixture
def private(private_url: str) -> Iterator[tuple[redis.Redis, str]]:
    """(client, url) of the private redis-server, flushed for this test."""
    client = redis.Redis.from_url(private_url)
    client.flushall()
    yield client, private_url
    client.close()


def request_keys(client: redis.Redis) -> list[bytes]:
    """Every key but those the api's background loops take on their own (the file sweeper's lease,
    now and then): what requests left behind."""
    return [k for k in client.keys("*") if k != keys.FILES_SWEEPER_LEASE.encode()]


@pytest.fixture
def rds(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def celery_client(redis_url: str) -> Celery:
    return make_celery(BrokerConfig(redis_url=redis_url))


@pytest.fixture
def worker(rds: redis.Redis, redis_url: str, celery_client: Celery) -> Iterator[FakeWorker]:
    w = FakeWorker(redis_url, celery_client).start()
    yield w
    w.stop()


@dataclass
class Served:
    app: FastAPI
    url: str

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)  # type: ignore[arg-type]


class ServerThread:
    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class Deployment:
    """The one api that runs on the session's Redis at a time. Replicas of one deployment share a
    config; an app of another config (its own file store, headroom, quotas) beside it would run
    this test's batches, parked jobs and file sweeps in its leader loops, against its own store
    and window. So an app is stopped before one of another config starts."""

    def __init__(self) -> None:
        self.key: object = None
        self.server: ServerThread | None = None
        self.served: Served | None = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.__exit__()
        self.key, self.server, self.served = None, None, None

    def start(self, key: object, app: FastAPI) -> Served:
        self.stop()
        self.server = ServerThread(app)
        self.key, self.served = key, Served(app, self.server.__enter__())
        return self.served


@pytest.fixture(scope="session")
def deployment() -> Iterator[Deployment]:
    live = Deployment()
    yield live
    live.stop()


@pytest.fixture(scope="session")
def serve(
    redis_url: str, deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Served]:
    """serve(tokenizer=None, **ApiConfig fields) -> the running api of that config: the one
    running if it has that config, else a new one (the other stopped: Deployment). Its file store
    is a temporary directory unless files_dir is given."""
    files_dir = tmp_path_factory.mktemp("files")

    def start(tokenizer: Tokenizer | None = None, **fields: object) -> Served:
        key = tuple(sorted({**fields, "tokenizer": id(tokenizer)}.items()))
        if deployment.key != key or deployment.served is None:
            defaults = {"redis_url": redis_url, "served_models": (MODEL,), "files_dir": files_dir}
            config = ApiConfig(**{**defaults, **fields})  # type: ignore[arg-type]
            return deployment.start(key, create_app(config, tokenizer))
        return deployment.served

    return start


@pytest.fixture(scope="session")
def api_tokenizer(smollm2: LoadedModel) -> HFTokenizer:
    """The real SmolLM2 tokenizer, as `kvferry api` hands it to the app."""
    return HFTokenizer(smollm2.tokenizer, smollm2.max_model_len)


@pytest.fixture
def api(serve: Callable[..., Served], rds: redis.Redis) -> Served:
    """The api without auth (Redis flushed for this test)."""
    return serve()


@pytest.fixture
def fresh_api(redis_url: str, rds: redis.Redis, deployment: Deployment, tmp_path: Path) -> Iterator[Served]:
    """An api of its own (fresh counters), without auth; the only one running meanwhile."""
    app = create_app(ApiConfig(redis_url=redis_url, served_models=(MODEL,), files_dir=tmp_path / "files"))
    yield deployment.start(object(), app)
    deployment.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Celery's Redis backend (used by the fake worker to record task states) calls redis-py's
    deprecated setex; that is Celery's business, not a finding of these tests."""
    here = Path(__file__).parent
    quiet = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
    for item in items:
        if here in item.path.parents:
            item.add_marker(quiet)
