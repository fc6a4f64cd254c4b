"""API keys and the tenants they stand for.

Keys come from three places, all optional: ApiConfig.api_key (the one-tenant shorthand, tenant
`tenant_of(key)`), ApiConfig.api_keys (`key:tenant` pairs) and ApiConfig.api_keys_file (one
`key tenant [weight]` per line, `#` comments; the weight, default 1, is the tenant's share in the
fair order of parked jobs: api/dispatch/), looked at no more than once a second and re-parsed when its
content changes (an edit within the same second, an atomic replace by rename: whatever its mtime
says). A deleted file revokes its keys (logged) until it is back; a file that does not parse (half
written, say) keeps the previous keys. Auth is on as soon as any of them is configured (an empty
or absent file then admits nobody). A presented key is compared with every configured key in
constant time."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from broker.defaults import DEFAULTS

log = logging.getLogger(__name__)
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # it is part of Redis keys and KV salts

Pairs = tuple[tuple[str, str], ...]


def tenant_of(api_key: str) -> str:
    """A stable name for a lone key's tenant that does not reveal the key."""
    return "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


def _pair(key: str, tenant: str, where: str) -> tuple[str, str]:
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"{where}: an API key must be non-empty and hold no whitespace")
    if not TENANT_PATTERN.match(tenant):
        raise ValueError(f"{where}: tenant {tenant!r} must match {TENANT_PATTERN.pattern}")
    return key, tenant


def parse_pairs(text: str | None) -> Pairs:
    """'k1:alice,k2:bob' -> (("k1", "alice"), ("k2", "bob")); a key may hold ':', a tenant not."""
    pairs = []
    for n, item in enumerate((text or "").split(","), start=1):
        if not item.strip():
            continue
        key, sep, tenant = item.strip().rpartition(":")
        if not sep:
            raise ValueError(f"api keys item {n}: expected key:tenant")
        pairs.append(_pair(key, tenant, f"api keys item {n}"))
    return tuple(pairs)


def parse_file(text: str, where: str) -> Pairs:
    return parse_entries(text, where)[0]


def _weight(text: str, where: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = 0.0
    if not 0 < weight < float("inf"):
        raise ValueError(f"{where}: a weight must be a positive number, got {text!r}")
    return weight


def parse_entries(text: str, where: str) -> tuple[Pairs, dict[str, float]]:
    """The file's (key, tenant) pairs and the weights it gives tenants (third column, default 1;
    a tenant listed with two different weights is an error)."""
    pairs: list[tuple[str, str]] = []
    weights: dict[str, float] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) not in (2, 3):
            raise ValueError(f"{where}:{n}: expected 'key tenant [weight]'")
        key, tenant = _pair(parts[0], parts[1], f"{where}:{n}")
        weight = _weight(parts[2], f"{where}:{n}") if len(parts) == 3 else 1.0
        if weights.setdefault(tenant, weight) != weight:
            given = f"{weights[tenant]:g}, {weight:g}"
            raise ValueError(f"{where}:{n}: tenant {tenant} has two weights ({given})")
        pairs.append((key, tenant))
    return tuple(pairs), weights


def _check_unique(pairs: Sequence[tuple[str, str]], where: str) -> None:
    tenants: dict[str, str] = {}
    for key, tenant in pairs:
        if tenants.setdefault(key, tenant) != tenant:
            raise ValueError(f"{where}: one key is listed for two tenants ({tenants[key]}, {tenant})")


class KeyRing:
    def __init__(
        self,
        api_key: str | None,
        api_keys: Pairs,
        api_keys_file: Path | None,
        reload_s: float = DEFAULTS.api_keys_reload_s,  # the file is looked at this often at most
    ) -> None:
        static = list(api_keys)
        if api_key is not None:
            static.append((api_key, tenant_of(api_key)))
        _check_unique(static, "KVFERRY_API_KEY(S)")
        self._static = tuple((k.encode(), t) for k, t in static)
        self.path = api_keys_file
        self._file: tuple[tuple[bytes, str], ...] = ()
        self._weights: dict[str, float] = {}  # the file's third column (api/dispatch/: fair order)
        self._digest: bytes | None = None  # of the content the keys were parsed from; None: absent
        self._checked = 0.0
        self.reload_s = reload_s
        self._lock = threading.Lock()
        if self.path is not None:
            self._reload(force=True)  # a file that cannot be read at start-up is a config error

    @property
    def enabled(self) -> bool:
        return bool(self._static) or self.path is not None

    def _reload(self, force: bool = False) -> None:
        assert self.path is not None
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError as exc:
            if force:
                raise ValueError(f"cannot read the API keys file: {exc}") from exc
            if self._digest is not None:
                log.warning("the API keys file %s is gone: its keys are revoked until it is back", self.path)
                self._file, self._digest, self._weights = (), None, {}
            return
        except OSError as exc:
            if force:
                raise ValueError(f"cannot read the API keys file: {exc}") from exc
            log.warning("keeping the previous API keys: %s", exc)
            return
        digest = hashlib.sha256(raw).digest()
        if not force and digest == self._digest:
            return
        try:
            pairs, weights = parse_entries(raw.decode("utf-8"), str(self.path))
            _check_unique([*((k.decode(), t) for k, t in self._static), *pairs], str(self.path))
        except (UnicodeDecodeError, ValueError) as exc:
            if force:
                raise ValueError(f"cannot read the API keys file: {exc}") from exc
            log.warning("keeping the previous API keys: %s", exc)  # a half-written file, say
            return
        if not force:
            log.info("API keys reloaded from %s: %d key(s)", self.path, len(pairs))
        self._file = tuple((k.encode(), t) for k, t in pairs)
        self._weights = weights
        self._digest = digest

    def _entries(self) -> tuple[tuple[bytes, str], ...]:
        if self.path is not None:
            now = time.monotonic()
            if now - self._checked >= self.reload_s:
                with self._lock:
                    if now - self._checked >= self.reload_s:
                        self._checked = now
                        self._reload()
        return self._static + self._file

    def tenant(self, token: str) -> str | None:
        """The tenant of a presented key, or None. Every key is compared, match or not."""
        presented = token.encode()
        found = None
        for key, tenant in self._entries():
            if hmac.compare_digest(presented, key) and found is None:
                found = tenant
        return found

    def weight(self, tenant: str) -> float:
        """The tenant's weight in the fair order of parked jobs (the keys file's third column; 1
        when it gives none, or for a tenant it does not list)."""
        self._entries()  # a changed file is re-read
        return self._weights.get(tenant, 1.0)

    def weights(self) -> dict[str, float]:
        self._entries()
        return dict(self._weights)

    def tenants(self) -> list[str]:
        return sorted({t for _, t in self._entries()})
