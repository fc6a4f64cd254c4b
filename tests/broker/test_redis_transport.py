"""broker/redis/transport.py: kombu's aliases serve the fixed classes, also after a failover to
the next URL of the list. The fix itself is tested on a real worker and a real Redis restart
(tests/integration/test_redis_restart.py)."""

from __future__ import annotations

from kombu import Connection
from kombu.transport import get_transport_cls

from broker.redis import transport as redis_transport


def test_the_aliases_serve_the_fixed_transports_after_a_failover_too() -> None:
    redis_transport.install()
    assert get_transport_cls("redis") is redis_transport.Transport
    assert get_transport_cls("rediss") is redis_transport.Transport
    assert get_transport_cls("sentinel") is redis_transport.SentinelTransport
    conn = Connection("redis://127.0.0.1:1/0;redis://127.0.0.1:2/0")
    assert type(conn.transport) is redis_transport.Transport
    conn.switch("redis://127.0.0.1:2/0")  # what kombu does when the first URL fails
    assert type(conn.transport) is redis_transport.Transport
