"""The batch runner's Lua scripts (api/batches/lua/*.lua). A runner's writes are `fenced`: the
fence check (lua/fence.lua) runs first, inside the same script, so a runner that lost its lease
writes nothing (api/batches/state.py raises LeaseLost); they share lua/leave.lua (a batch's end)."""

from __future__ import annotations

from functools import cache
from typing import Any

from redis.asyncio import Redis

from api.lua import Script


@cache
def _script(name: str, fenced: bool) -> Script:
    return Script(__file__, name, ("leave", "fence") if fenced else ())


async def run(redis: Redis, name: str, keys: list[str], args: list[Any], fenced: bool = False) -> Any:
    return await _script(name, fenced)(redis, keys, args)
