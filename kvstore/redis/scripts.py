"""The cold tier's Lua scripts (kvstore/redis/lua/*.lua), each with the shared prelude in front.

The index, LRU, byte counter and pins change only in these scripts, atomic against the other
workers: a plain MULTI/EXEC cannot tell whether another worker wrote the same pack meanwhile, so
its byte counter would drift. Torch-free: the API runs RELEASE_OWNER to free a deleted session's pins.

Each script comes in two variants (``CLUSTER`` false or true in its text). On a Redis Cluster a
script may touch only keys of its own slot, the tier's metadata slot, and packs live in slots of
their own (kvstore/redis/keys.py): there the scripts never read or delete a pack; they take its
size as an argument and return the packs they dropped, for the client to UNLINK on their shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from kvstore.redis.client import KVClient, is_cluster
from kvstore.redis.keys import HASH_LEN

_LUA = Path(__file__).with_name("lua")


@cache
def script(name: str, cluster: bool = False) -> str:
    """The full text of lua/<name>.lua, after the prelude."""
    prelude = (_LUA / "prelude.lua").read_text(encoding="utf-8")
    body = (_LUA / f"{name}.lua").read_text(encoding="utf-8")
    flag = "true" if cluster else "false"
    return f"local HASH_LEN = {HASH_LEN}\nlocal CLUSTER = {flag}\n{prelude}\n{body}"


class TierScript:
    """One script for one client: EVALSHA, loaded on first use. On a cluster it is loaded on the
    node of its keys' slot only (redis-py's SCRIPT LOAD goes to every primary, and fails while
    one of them is down)."""

    def __init__(self, client: KVClient, name: str) -> None:
        self.client = client
        self.cluster = is_cluster(client)
        self.text = script(name, self.cluster)
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()

    def __call__(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return self.client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            if is_cluster(self.client):
                node = self.client.get_node_from_key(keys[0])
                self.client.execute_command("SCRIPT LOAD", self.text, target_nodes=node)
            else:
                self.client.script_load(self.text)
            return self.client.evalsha(self.sha, len(keys), *keys, *args)


REGISTER = "register"
REPAIR = "repair"
PIN_OWNER = "pin_owner"
RELEASE_OWNER = "release_owner"
