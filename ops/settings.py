"""Settings: the one configuration object. Read from KVFERRY_* environment variables once, at
start-up, then overridden by CLI flags; never mutated afterwards."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from broker.celery_app import BrokerConfig
from workers.engine.config import EngineConfig
from workers.engine_service import TierConfig

ENV_PREFIX = "KVFERRY_"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str | int) -> int:
    """'512M', '1.5G', '4096' -> bytes (binary units: 1M = 1 MiB)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 512M, 2G, 1048576)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass(frozen=True, slots=True)
class Settings:
    model: str = "smollm2"
    served_model_name: str | None = None
    cache_size: str = "512M"
    block_size: int = 16
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    warm_cache_size: str = "256M"  # host-memory tier for blocks evicted from the pool; 0 = none
    redis_cache_size: str = "2G"  # byte cap of the shared Redis tier (own LRU); 0 = no Redis tier
    session_ttl_s: int = 3600  # idle sessions expire; their pinned blocks become ordinary cached ones
    tenant_kv_quota: str | None = None  # bytes of session-pinned blocks per tenant in the Redis tier
    dtype: str = "float32"
    device: str = "cpu"
    torch_threads: int | None = None
    debug_slow_step_s: float = 0.0  # test hook: prefill steps sleep this much longer
    debug_crash_step: int = 0  # test hook: the N-th engine step raises once; 0 = never
    cache_dir: Path = Path.home() / ".cache" / "kvferry"
    # the queue service
    redis_url: str = DEFAULT_REDIS_URL
    kv_redis_url: str | None = None  # the KV tier's own Redis (block packs, index); None: redis_url
    worker_name: str | None = None
    worker_concurrency: int = 32  # jobs one worker runs at once (they share its engine's batches)
    job_time_limit_s: int = 1800
    job_ttl_s: int = 86400  # a finished job's result, stream and metadata live this long (no prompt)
    heartbeat_ttl_s: int = 3  # the heartbeat never waits on the engine, so a short TTL is safe
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    api_key: str | None = None  # when set, requests need "Authorization: Bearer <key>"
    api_keys: str | None = None  # "key:tenant,key2:tenant2": one tenant per key (api/tenants.py)
    api_keys_file: Path | None = None  # one "key tenant" per line, # comments; re-read when it changes
    tenant_max_jobs: int = 0  # unfinished jobs one tenant may have at once (over it: 429); 0 = no cap
    default_max_tokens: int = 1024  # max_tokens of a request that names none (capped by the context)
    flower_port: int = 5555
    routing: str = "cache-aware"  # "round-robin" and "shared" are the benchmark's baselines

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """KVFERRY_<FIELD> variables, then overrides (None values are ignored)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _convert(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """KVFERRY_* variables that reproduce these settings in a child process."""
        env = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                env[ENV_PREFIX + f.name.upper()] = (
                    str(value).lower() if isinstance(value, bool) else str(value)
                )
        return env

    def with_overrides(self, **overrides: Any) -> Settings:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def broker_config(self) -> BrokerConfig:
        return BrokerConfig(
            redis_url=self.redis_url,
            job_time_limit_s=self.job_time_limit_s,
            heartbeat_ttl_s=self.heartbeat_ttl_s,
            heartbeat_interval_s=max(0.25, self.heartbeat_ttl_s / 4),
            result_ttl_s=self.job_ttl_s,
        )

    def tier_config(self) -> TierConfig:
        return TierConfig(
            redis_capacity_bytes=parse_size(self.redis_cache_size),
            session_ttl_s=self.session_ttl_s,
            tenant_kv_quota_bytes=parse_size(self.tenant_kv_quota) if self.tenant_kv_quota else 0,
        )

    @property
    def served_model(self) -> str:
        return self.served_model_name or self.model

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model,
            served_model_name=self.served_model_name,
            cache_size_bytes=parse_size(self.cache_size),
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
            warm_cache_size_bytes=parse_size(self.warm_cache_size),
            dtype=self.dtype,
            device=self.device,
            torch_threads=self.torch_threads,
            debug_slow_step_s=self.debug_slow_step_s,
            debug_crash_step=self.debug_crash_step,
            default_max_tokens=self.default_max_tokens,
        )


def _convert(name: str, annotation: Any, raw: str) -> Any:
    kind = str(annotation)
    if "bool" in kind:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{ENV_PREFIX}{name.upper()} must be a boolean, got {raw!r}")
    if "float" in kind:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{ENV_PREFIX}{name.upper()} must be a number, got {raw!r}") from None
    if "int" in kind:
        if raw == "" and "None" in kind:
            return None
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{ENV_PREFIX}{name.upper()} must be an integer, got {raw!r}") from None
    if "Path" in kind:
        return Path(raw).expanduser()
    if raw == "" and "None" in kind:
        return None  # an empty optional (e.g. KVFERRY_API_KEY= in compose) means unset
    return raw
