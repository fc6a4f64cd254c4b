"""The Redis keys of stored responses and conversations (queue Redis), each under its tenant: an
id another tenant made names nothing here."""

from __future__ import annotations

# A stored response lives this long after its last change (OpenAI keeps responses 30 days); its
# record holds the whole conversation, so continuing it works after its kvferry session (and the
# KV blocks that session pinned) expired: the prompt is then served from whatever prefix blocks
# the pool and the tiers still hold, and computed for the rest.
RESPONSE_TTL_S = 30 * 86400
CONVERSATION_TTL_S = 30 * 86400  # idle conversations; every append renews it


def response(tenant: str, response_id: str) -> str:
    return f"kvferry:response:{tenant}:{response_id}"


def response_final(tenant: str, response_id: str) -> str:
    """Set (NX) by whoever settles the response first: its end is applied once."""
    return f"kvferry:response:{tenant}:{response_id}:final"


def conversation(tenant: str, conversation_id: str) -> str:
    return f"kvferry:conversation:{tenant}:{conversation_id}"


def conversation_items(tenant: str, conversation_id: str) -> str:
    return f"kvferry:conversation:{tenant}:{conversation_id}:items"
