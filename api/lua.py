"""The api's Lua scripts (`lua/*.lua` beside the module that runs them) run through the one wrapper
the broker's run through too (broker/redis/lua.py): EVALSHA, loaded on first use; each is one
atomic check-and-write against every other api replica."""

from __future__ import annotations

from broker.redis.lua import Call, Script, affixes

__all__ = ["Call", "Script", "affixes"]
