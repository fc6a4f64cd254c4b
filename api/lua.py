"""The api's Lua scripts (`lua/*.lua` beside the module that runs them), run by EVALSHA and
loaded on first use: each is one atomic check-and-write against every other api replica."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

__all__ = ["Script", "affixes"]


@cache
def _text(path: Path, preludes: tuple[Path, ...]) -> tuple[str, str]:
    text = "".join(p.read_text(encoding="utf-8") for p in (*preludes, path))
    return text, hashlib.sha1(text.encode()).hexdigest()


class Script:
    """lua/<name>.lua next to `module` (a module's __file__), after each lua/<prelude>.lua given
    (what every script of a family runs or calls first, as the batch runner's lease fence)."""

    def __init__(self, module: str, name: str, preludes: tuple[str, ...] = ()) -> None:
        lua = Path(module).with_name("lua")
        self.path = lua / f"{name}.lua"
        self.preludes = tuple(lua / f"{p}.lua" for p in preludes)

    async def __call__(self, redis: Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        text, sha = _text(self.path, self.preludes)
        try:
            return await redis.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:
            await redis.script_load(text)
            return await redis.evalsha(sha, len(keys), *keys, *args)


def affixes(key_format: Callable[[str], str]) -> tuple[str, str]:
    """(prefix, suffix) of a one-id key format (broker/keys.py), for a script that builds the keys
    of ids it reads from Redis: key = prefix .. id .. suffix."""
    prefix, _, suffix = key_format("\0").partition("\0")
    return prefix, suffix
