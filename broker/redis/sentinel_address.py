"""The queue Redis's address, one string for every client: a plain `redis://` URL, or under
Sentinel a `redis+sentinel://:password@h1:p1,h2:p2,h3:p3/db?master=name` address, which this
module alone writes and reads, with Celery's broker and result backend URLs and their transport
options (kombu's `sentinel://` transport, Celery's SentinelBackend). No redis-py here: the
settings validate the address, and reading settings must not load a client library
(broker/redis/connect.py builds the clients from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

SCHEME = "redis+sentinel"


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    password: str | None = None
    db: int = 0


def parse_sentinels(text: str) -> tuple[tuple[str, int], ...]:
    """'h:p,h:p' -> ((h, p), ...); a clear ValueError for anything else."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"not host:port: {item!r} (expected 'h:p,h:p,h:p')")
        found.append((host, int(port)))
    if not found:
        raise ValueError("no sentinels given")
    return tuple(found)


def queue_address(redis_url: str, sentinels: str | None, master: str | None) -> str:
    """The address for the settings: `redis_url` as it is without sentinels; with them, the
    sentinel address with redis_url's password and db (its host and port are not used)."""
    if not sentinels:
        return redis_url
    if not master:
        raise ValueError("KVFERRY_REDIS_SENTINELS needs KVFERRY_REDIS_MASTER (the master's name)")
    parts = urlsplit(redis_url)
    db = parts.path.strip("/") or "0"
    auth = f":{quote(unquote(parts.password), safe='')}@" if parts.password else ""
    hosts = ",".join(f"{h}:{p}" for h, p in parse_sentinels(sentinels))
    return f"{SCHEME}://{auth}{hosts}/{db}?master={quote(master, safe='')}"


def parse(address: str) -> SentinelAddress | None:
    """The sentinel address's parts; None for a plain Redis URL."""
    if not address.startswith(SCHEME + "://"):
        return None
    rest = address[len(SCHEME) + 3 :]
    auth, _, rest = rest.rpartition("@")
    hosts, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    master = parse_qs(query).get("master", [""])[0]
    if not master:
        raise ValueError("a redis+sentinel address needs ?master=<name>")
    password = unquote(auth.partition(":")[2]) if auth else None
    return SentinelAddress(parse_sentinels(hosts), master, password or None, int(path or 0))


def celery_url(address: str) -> str:
    """Celery's broker / result backend URL: kombu's `sentinel://:pw@h:p/db;sentinel://...`."""
    found = parse(address)
    if found is None:
        return address
    auth = f":{quote(found.password, safe='')}@" if found.password else ""
    return ";".join(f"sentinel://{auth}{h}:{p}/{found.db}" for h, p in found.sentinels)


def transport_options(address: str) -> dict[str, Any]:
    """What kombu's Sentinel transport and Celery's SentinelBackend need besides the URL."""
    found = parse(address)
    if found is None:
        return {}
    options: dict[str, Any] = {"master_name": found.master}
    if found.password:
        options["sentinel_kwargs"] = {"password": found.password}
    return options


def is_sentinel(address: str) -> bool:
    return parse(address) is not None
