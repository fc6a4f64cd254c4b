"""Key formats: no (tenant, session id) pair can name another pair's keys, whatever it holds; no
tenant, job, file or batch id can name a global key or another id's key."""

from __future__ import annotations

import inspect
from collections.abc import Callable

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


def _one_name_formats() -> dict[str, Callable[[str], str]]:
    """Every key format of one caller-given name (a tenant, job, file, batch, worker id...)."""
    out = {}
    for name, f in vars(keys).items():
        if callable(f) and not name.startswith("_") and name != "parse_session_member":
            params = list(inspect.signature(f).parameters)
            if len(params) == 1:
                out[name] = f
    return out


def _globals() -> set[str]:
    return {v for n, v in vars(keys).items() if n.isupper() and isinstance(v, str)}


def test_no_name_spells_a_global_key_or_another_names_key() -> None:
    """A tenant named `active` once read every tenant's active batches: its list was the runner's
    global one. Crafted names: the globals' tails and every name followed by every suffix."""
    formats = _one_name_formats()
    assert {"tenant_batches", "tenant_files", "batch_record", "file_record", "job_meta"} <= set(formats)
    suffixes = {f("\0").rpartition("\0")[2] for f in formats.values()}
    tails = {g.split(":", 1)[1] for g in _globals() if ":" in g} | {g.rpartition(":")[2] for g in _globals()}
    bases = {"", "a", "x:y", *tails}
    # and each suffix's heads (":quota" of ":quota:files": tenant_files("a:quota") would spell a
    # tenant key with the suffix ":quota:files")
    heads = {s[:i] for s in suffixes for i in range(1, len(s)) if s[i] == ":"}
    names = bases | {b + s for b in bases for s in suffixes | heads}
    seen: dict[str, tuple[str, str]] = {g: ("global", g) for g in _globals()}
    for fname, f in formats.items():
        for name in names:
            key = f(name)
            assert key not in seen, f"{fname}({name!r}) and {seen[key]} share {key!r}"
            seen[key] = (fname, name)
    assert keys.tenant_batches("active") != keys.BATCHES_ACTIVE


def test_response_and_conversation_keys_never_collide_across_ids_or_kinds() -> None:
    """A crafted id ("resp_x:final", "conv_x:items") names no key of another id or another kind:
    GET /v1/responses/resp_x:final once read the end marker of resp_x as a response record."""
    ids = [*IDS, "x:final", "x:record", "x:items", "x:final:record", "record", "final", "items"]
    kinds: dict[str, Callable[[str, str], str]] = {
        "response": keys.response_record,
        "final": keys.response_final,
        "conversation": keys.conversation_record,
        "items": keys.conversation_items,
        "session": keys.session,
    }
    seen: dict[str, tuple[str, str, str]] = {}
    for tenant in TENANTS:
        for ident in ids:
            for kind, f in kinds.items():
                key = f(tenant, ident)
                assert key not in seen, f"{(tenant, ident, kind)} and {seen[key]} share {key}"
                seen[key] = (tenant, ident, kind)
    globals_ = _globals()
    assert not globals_ & set(seen), globals_ & set(seen)
