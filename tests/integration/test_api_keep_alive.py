"""The api keeps an idle connection open longer than clients' pools keep theirs (httpx, the openai
SDK: 5 s), so it never closes one as a client reuses it: a request sent on a connection the server
is closing is reset, and the client sees a read error (uvicorn's own default keep-alive is 5 s)."""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

import pytest

CLIENT_POOL_EXPIRY_S = 5.0  # httpx's keepalive_expiry, the openai SDK's too


def _healthz(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    response.read()
    assert not response.will_close, "the api asked to close the connection"
    return response.status


def test_an_idle_connection_outlives_a_clients_pool_expiry(api_url: str) -> None:  # conftest's api
    url = urlsplit(api_url)
    assert url.hostname is not None and url.port is not None
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
    try:
        assert _healthz(conn) == 200
        sock = conn.sock
        time.sleep(CLIENT_POOL_EXPIRY_S + 1.0)
        try:
            status = _healthz(conn)
        except (http.client.RemoteDisconnected, ConnectionResetError) as e:
            pytest.fail(f"the api closed a connection idle for less than a client keeps it: {e!r}")
        assert status == 200 and conn.sock is sock  # the same connection, reused
    finally:
        conn.close()
