"""The kvferry session a `prompt_cache_key` names (chat completions and responses): the router
keeps a session's turns on the worker that holds its blocks while that stays cheapest, and the
worker reuses its tokens, so a client that names its conversation by a cache key (Codex sends the
whole history each turn with one) is served from the cache. Sessions are per tenant already: two
tenants' equal keys are two sessions."""

from __future__ import annotations

import hashlib

PREFIX = "pck."  # pck.<40 hex of the key's sha256>: any key fits a session id's charset


def session_of(prompt_cache_key: str) -> str:
    return PREFIX + hashlib.sha256(prompt_cache_key.encode()).hexdigest()[:40]
