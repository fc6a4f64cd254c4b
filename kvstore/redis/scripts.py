"""The cold tier's Lua scripts (kvstore/redis/lua/*.lua), each with the shared prelude in front.

The index, LRU, byte counter and pins change only in these scripts, atomic against the other
workers: a plain MULTI/EXEC cannot tell whether another worker wrote the same pack meanwhile, so
its byte counter would drift. Torch-free: the API runs RELEASE_OWNER to free a deleted session's pins.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from kvstore.redis.keys import HASH_LEN

_LUA = Path(__file__).with_name("lua")


@cache
def script(name: str) -> str:
    """The full text of lua/<name>.lua, after the prelude."""
    prelude = (_LUA / "prelude.lua").read_text(encoding="utf-8")
    body = (_LUA / f"{name}.lua").read_text(encoding="utf-8")
    return f"local HASH_LEN = {HASH_LEN}\n{prelude}\n{body}"


REGISTER = "register"
REPAIR = "repair"
PIN_OWNER = "pin_owner"
RELEASE_OWNER = "release_owner"
