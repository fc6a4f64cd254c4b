"""The one wrapper of the api's and the broker's Lua scripts (the KV tier's own: kvstore/redis/
scripts.py). A script is `lua/<name>.lua` beside the module that runs it, after the preludes it
names (Lua functions it calls: a name in the same `lua/` folder, or a path to another's). It runs
by EVALSHA and is loaded on first use, on a sync or an asyncio client; on a pipeline it is queued,
and the pipeline loads it before it runs. Its KEYS and ARGV are built by name: a call object with
keys() and args() beside the module (`Script.run`), never a positional list at the call site."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol, overload

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.commands.core import Script as PipelineScript
from redis.exceptions import NoScriptError

__all__ = ["Call", "Script", "affixes"]


class Call(Protocol):
    """One run's KEYS and ARGV, each named in the object that builds them."""

    def keys(self) -> list[str]: ...

    def args(self) -> list[Any]: ...


@cache
def _text(path: Path, preludes: tuple[Path, ...]) -> tuple[str, str]:
    text = "".join(p.read_text(encoding="utf-8") for p in (*preludes, path))
    return text, hashlib.sha1(text.encode()).hexdigest()


class Script:
    """lua/<name>.lua next to `module` (a module's __file__), after each prelude given: a name
    (lua/<prelude>.lua in the same folder) or a path (another folder's, as broker/jobs/lua/)."""

    def __init__(self, module: str, name: str, preludes: tuple[str | Path, ...] = ()) -> None:
        lua = Path(module).with_name("lua")
        self.path = lua / f"{name}.lua"
        self.preludes = tuple(p if isinstance(p, Path) else lua / f"{p}.lua" for p in preludes)

    @property
    def text(self) -> str:
        return _text(self.path, self.preludes)[0]

    @overload
    def __call__(
        self, client: aioredis.Redis, keys: Sequence[Any], args: Sequence[Any]
    ) -> Awaitable[Any]: ...

    @overload
    def __call__(self, client: redis.Redis, keys: Sequence[Any], args: Sequence[Any]) -> Any: ...

    def __call__(self, client: redis.Redis | aioredis.Redis, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The script's reply (awaitable on an asyncio client); on a pipeline, the pipeline."""
        if isinstance(client, aioredis.Redis):
            return self._async(client, keys, args)
        text, sha = _text(self.path, self.preludes)
        if isinstance(client, redis.client.Pipeline):
            return PipelineScript(client, text)(list(keys), list(args), client)
        try:
            return client.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(text)
            return client.evalsha(sha, len(keys), *keys, *args)

    @overload
    def run(self, client: aioredis.Redis, call: Call) -> Awaitable[Any]: ...

    @overload
    def run(self, client: redis.Redis, call: Call) -> Any: ...

    def run(self, client: redis.Redis | aioredis.Redis, call: Call) -> Any:
        """The script with `call`'s KEYS and ARGV."""
        return self(client, call.keys(), call.args())

    async def _async(self, client: aioredis.Redis, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        text, sha = _text(self.path, self.preludes)
        if isinstance(client, aioredis.client.Pipeline):
            return await AsyncScript(client, text)(list(keys), list(args), client)
        try:
            return await client.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:
            await client.script_load(text)
            return await client.evalsha(sha, len(keys), *keys, *args)


def affixes(key_format: Callable[[str], str]) -> tuple[str, str]:
    """(prefix, suffix) of a one-id key format (broker/keys.py), for a script that builds the keys
    of ids it reads from Redis: key = prefix .. id .. suffix."""
    prefix, _, suffix = key_format("\0").partition("\0")
    return prefix, suffix
