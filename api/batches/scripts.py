"""The batch runner's Lua scripts (api/batches/lua/*.lua). A runner's writes are `fenced`: the
fence check (lua/fence.lua) runs first, inside the same script, so a runner that lost its lease
writes nothing (api/batches/state.py raises LeaseLost)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

_LUA = Path(__file__).with_name("lua")


@cache
def text(name: str, fenced: bool = False) -> str:
    body = (_LUA / f"{name}.lua").read_text(encoding="utf-8")
    return (_LUA / "fence.lua").read_text(encoding="utf-8") + body if fenced else body


async def run(redis: Redis, name: str, keys: list[str], args: list[Any], fenced: bool = False) -> Any:
    return await redis.eval(text(name, fenced), len(keys), *keys, *args)  # type: ignore[misc,unused-ignore]
