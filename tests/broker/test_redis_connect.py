"""broker/redis/connect.py: the queue Redis's address under Sentinel, and what every client makes
of it (redis-py's Sentinel clients, kombu's sentinel:// transport and Celery's SentinelBackend with
their options); a plain URL stays exactly what it was."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from broker.celery_app import BrokerConfig, make_celery
from broker.redis import connect as redis_connect
from broker.redis.result_backend import SendOnlySentinelBackend
from ops.settings import Settings, SettingsError

SENTINELS = "127.0.0.1:26379,127.0.0.1:26380,10.0.0.3:26381"
URL = "redis://:s3cr%2Ft@ignored:6379/2"


def test_a_plain_url_is_left_as_it_is() -> None:
    assert redis_connect.queue_address(URL, None, None) == URL
    assert redis_connect.parse(URL) is None
    assert redis_connect.celery_url(URL) == URL and redis_connect.transport_options(URL) == {}
    client = redis_connect.connect(URL)
    assert type(client.connection_pool) is redis.ConnectionPool
    assert client.connection_pool.connection_kwargs["password"] == "s3cr/t"


def test_the_sentinel_address_carries_sentinels_master_password_and_db() -> None:
    address = redis_connect.queue_address(URL, SENTINELS, "kvferry")
    assert address == (
        "redis+sentinel://:s3cr%2Ft@127.0.0.1:26379,127.0.0.1:26380,10.0.0.3:26381/2?master=kvferry"
    )
    found = redis_connect.parse(address)
    assert found == redis_connect.SentinelAddress(
        (("127.0.0.1", 26379), ("127.0.0.1", 26380), ("10.0.0.3", 26381)), "kvferry", "s3cr/t", 2
    )
    assert redis_connect.celery_url(address) == (
        "sentinel://:s3cr%2Ft@127.0.0.1:26379/2;sentinel://:s3cr%2Ft@127.0.0.1:26380/2;"
        "sentinel://:s3cr%2Ft@10.0.0.3:26381/2"
    )
    assert redis_connect.transport_options(address) == {
        "master_name": "kvferry",
        "sentinel_kwargs": {"password": "s3cr/t"},
    }


def test_sync_and_async_clients_ask_the_sentinels_for_the_master() -> None:
    address = redis_connect.queue_address(URL, SENTINELS, "kvferry")
    client = redis_connect.connect(address, socket_timeout=3)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "kvferry"
    assert pool.connection_kwargs["password"] == "s3cr/t" and pool.connection_kwargs["db"] == 2
    assert pool.connection_kwargs["retry"] is not None  # rides out the failover itself
    sentinel = pool.sentinel_manager
    assert [c.connection_pool.connection_kwargs["port"] for c in sentinel.sentinels] == [26379, 26380, 26381]
    assert sentinel.sentinels[0].connection_pool.connection_kwargs["password"] == "s3cr/t"
    aclient = redis_connect.connect_async(address)
    assert aclient.connection_pool.service_name == "kvferry"  # type: ignore[attr-defined]


def test_celery_broker_and_backend_follow_the_sentinels() -> None:
    address = redis_connect.queue_address(URL, SENTINELS, "kvferry")
    app = make_celery(BrokerConfig(redis_url=address), send_only=True)
    assert app.conf.broker_url.startswith("sentinel://")
    for options in (app.conf.broker_transport_options, app.conf.result_backend_transport_options):
        assert options["master_name"] == "kvferry"
        assert options["sentinel_kwargs"] == {"password": "s3cr/t"}
    assert "visibility_timeout" in app.conf.broker_transport_options  # today's options kept
    assert isinstance(app.backend, SendOnlySentinelBackend)
    with app.connection_for_write() as conn:
        assert conn.transport_cls == "sentinel" and len(conn.alt) == 3


def test_settings_read_the_sentinels_once_and_refuse_half_of_them() -> None:
    env = {"KVFERRY_REDIS_URL": URL, "KVFERRY_REDIS_SENTINELS": SENTINELS, "KVFERRY_REDIS_MASTER": "kvferry"}
    settings = Settings.from_env(env)
    assert settings.broker_config().redis_url == settings.queue_url == settings.api_config().redis_url
    assert settings.queue_url.startswith("redis+sentinel://")
    assert Settings.from_env({"KVFERRY_REDIS_URL": URL}).broker_config().redis_url == URL
    with pytest.raises(SettingsError, match="KVFERRY_REDIS_MASTER"):
        Settings.from_env({"KVFERRY_REDIS_SENTINELS": SENTINELS})
    with pytest.raises(SettingsError, match="host:port"):
        Settings.from_env({"KVFERRY_REDIS_SENTINELS": "nohost", "KVFERRY_REDIS_MASTER": "m"})
