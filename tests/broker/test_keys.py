"""Key formats: no (tenant, session id) pair can name another pair's keys, whatever it holds."""

from __future__ import annotations

from broker import keys

IDS = ["x", "x:deleted", "x:tokens", "deleted", "1:x", "", ":", "a:b:c"]
TENANTS = ["", "t", "1:x", "t:x"]


def test_session_keys_never_collide_across_sessions_or_kinds() -> None:
    seen: dict[str, tuple[str, str, str]] = {}
    for tenant in TENANTS:
        for sid in IDS:
            for kind, key in (
                ("record", keys.session(tenant, sid)),
                ("tombstone", keys.session_deleted(tenant, sid)),
                ("tokens", keys.session_tokens(tenant, sid)),
            ):
                assert key not in seen, f"{(tenant, sid, kind)} and {seen[key]} share {key}"
                seen[key] = (tenant, sid, kind)
