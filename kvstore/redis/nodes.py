"""Commands on keys of many slots, one pipeline per Redis Cluster node: the tier's packs (each in
a slot of its own) are written, renewed, checked and unlinked this way. A node that fails fails
only its own keys: each key's reply is its value or the exception, never a raise for the lot.

redis-py's cluster pipeline would route these too, but it raises for the whole pipeline when one
node is down; and MGET/DEL of several keys need them all in one slot. On one plain Redis the
commands go in one pipeline. A reply saying the key moved (MOVED, ASK) is sent again through
redis-py's cluster client, which follows it and refreshes its slot map.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, cast

from redis.exceptions import AskError

from kvstore.redis.client import KV_ERRORS, KVClient, is_cluster

log = logging.getLogger(__name__)
Command = tuple[Any, ...]  # ("SET", key, value, ...): the key is always the second item


def by_node(client: KVClient, keys: Sequence[Any]) -> dict[str, list[int]]:
    """Where each key lives: node name -> the keys' positions ("" for all on a plain Redis)."""
    if not is_cluster(client):
        return {"": list(range(len(keys)))}
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(client.get_node_from_key(key).name, []).append(i)
    return groups


def run(client: KVClient, commands: Sequence[Command]) -> list[Any]:
    """Each command's reply, or the exception it met (its node's, when the node is away)."""
    replies: list[Any] = [None] * len(commands)
    for name, positions in by_node(client, [c[1] for c in commands]).items():
        try:
            node_client = (
                client.get_redis_connection(client.get_node(node_name=name)) if is_cluster(client) else client
            )
            pipe = node_client.pipeline(transaction=False)
            for i in positions:
                pipe.execute_command(*commands[i])
            for i, reply in zip(positions, pipe.execute(raise_on_error=False), strict=True):
                replies[i] = reply
        except KV_ERRORS as exc:
            for i in positions:
                replies[i] = exc
    for i, reply in enumerate(replies):
        if isinstance(reply, AskError):  # MOVED or ASK: the slot map changed; redis-py follows it
            try:
                replies[i] = client.execute_command(*commands[i])
            except KV_ERRORS as exc:
                replies[i] = exc
    return replies


def unlink(client: KVClient, keys: Sequence[Any]) -> int:
    """UNLINK the keys, best effort (a pack left on a dead shard has a TTL); returns failures."""
    failed = [r for r in run(client, [("UNLINK", k) for k in keys]) if isinstance(r, Exception)]
    if failed:
        log.warning("unlinking %d pack(s) failed: %s", len(failed), failed[0])
    return len(failed)


def gone(client: KVClient, keys: Sequence[Any]) -> list[bool]:
    """Whether each key is surely absent: False where it exists or its node did not answer."""
    return [r == 0 for r in run(client, [("EXISTS", k) for k in keys])]


def scan_slot(client: KVClient, match: str, key_in_slot: str) -> Iterator[bytes]:
    """SCAN for keys of one slot (a tier's metadata: its owners, its pin sets): on a cluster only
    the node that holds ``key_in_slot``'s slot is asked, so the other shards may be down."""
    if is_cluster(client):
        node = client.get_node_from_key(key_in_slot)
        return cast("Iterator[bytes]", client.scan_iter(match=match, count=1000, target_nodes=node))
    return cast("Iterator[bytes]", client.scan_iter(match=match, count=1000))
