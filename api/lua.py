"""The api's Lua scripts (`lua/*.lua` beside the module that runs them), run by EVALSHA and
loaded on first use: each is one atomic check-and-write against every other api replica."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

__all__ = ["Script"]


@cache
def _text(path: Path) -> tuple[str, str]:
    text = path.read_text(encoding="utf-8")
    return text, hashlib.sha1(text.encode()).hexdigest()


class Script:
    """lua/<name>.lua next to `module` (a module's __file__)."""

    def __init__(self, module: str, name: str) -> None:
        self.path = Path(module).with_name("lua") / f"{name}.lua"

    async def __call__(self, redis: Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        text, sha = _text(self.path)
        try:
            return await redis.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:
            await redis.script_load(text)
            return await redis.evalsha(sha, len(keys), *keys, *args)
