"""Settings: the one configuration object. Read from KVFERRY_* environment variables once, at
start-up, then overridden by CLI flags; frozen afterwards.

The fields (names, types, defaults) are broker/defaults.py's `SettingsFields`; this module adds
how they are read (pydantic-settings) and builds each part's config from them. It imports no
engine module at import time: the API and the light CLI commands stay torch-free."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from pydantic import ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from broker.defaults import DEFAULTS, SettingsFields, parse_size
from broker.redis.sentinel_address import queue_address

if TYPE_CHECKING:
    from api.config import ApiConfig
    from broker.celery_app import BrokerConfig
    from workers.engine.config import EngineConfig
    from workers.tiers.config import TierConfig

__all__ = ["DEFAULTS", "DEFAULT_REDIS_URL", "ENV_PREFIX", "Settings", "SettingsError", "parse_size"]

ENV_PREFIX = "KVFERRY_"
DEFAULT_REDIS_URL = DEFAULTS.redis_url  # `serve` starts its own Redis when given this one
_Config = TypeVar("_Config")
_S = TypeVar("_S", bound="Settings")


class SettingsError(ValueError):
    """A setting with a bad value; the message names the variable (or flag) and the value."""


class _Environ(EnvSettingsSource):
    """KVFERRY_* variables from a given mapping (os.environ, or a test's dict). An empty value
    means unset (compose writes `KVFERRY_API_KEY=` for "no key")."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._environ.items() if v != ""}


class Settings(SettingsFields, BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Settings(...) is defaults + arguments, never the process's environment: that is
        # from_env's job, so a test's Settings(redis_url=...) means exactly that.
        return (init_settings,)

    @model_validator(mode="after")
    def _sentinels_named(self) -> Self:
        queue_address(self.redis_url, self.redis_sentinels, self.redis_master)  # a ValueError if not
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """KVFERRY_<FIELD> variables, then overrides (None values are ignored)."""
        values: dict[str, Any] = _Environ(cls, os.environ if environ is None else environ)()
        given = {k: v for k, v in overrides.items() if v is not None}
        return _validated(cls, {**values, **given}, {k: v for k, v in values.items() if k not in given})

    def to_env(self) -> dict[str, str]:
        """KVFERRY_* variables that reproduce these settings in a child process."""
        env = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                env[ENV_PREFIX + name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
        return env

    def with_overrides(self, **overrides: Any) -> Self:
        given = {k: v for k, v in overrides.items() if v is not None}
        return _validated(type(self), {**self.model_dump(), **given}, {})

    @property
    def served_model(self) -> str:
        return self.served_model_name or self.model

    @property
    def queue_url(self) -> str:
        """The queue Redis's address for every client: redis_url, or under Sentinel the
        sentinels' address with redis_url's password and db (broker/redis/connect.py)."""
        return queue_address(self.redis_url, self.redis_sentinels, self.redis_master)

    @property
    def redis_tier_on(self) -> bool:
        """Whether workers run the Redis tier: it hangs off the warm tier, which prefix caching
        feeds (workers/jobs/engine_service.py, workers/engine/llm_engine.py)."""
        return self.redis_cache_size > 0 and self.warm_cache_size > 0 and self.enable_prefix_caching

    # Each part's config: fields of the same name come from here; the rest is spelled out.

    def broker_config(self) -> BrokerConfig:
        from broker.celery_app import BrokerConfig, heartbeat_interval_for

        return self._project(
            BrokerConfig,
            heartbeat_interval_s=heartbeat_interval_for(self.heartbeat_ttl_s),
            result_ttl_s=self.job_ttl_s,
            redis_url=self.queue_url,
        )

    def tier_config(self) -> TierConfig:
        from workers.tiers.config import TierConfig

        return self._project(
            TierConfig,
            redis_capacity_bytes=int(self.redis_cache_size),
            tenant_kv_quota_bytes=int(self.tenant_kv_quota or 0),
            kv_write_queue_bytes=int(self.kv_write_queue_size),
            host_heap_reserve_bytes=int(self.host_heap_reserve),
            warm_start_bytes=min(int(self.warm_start_size), int(self.warm_cache_size)),
            tier_dtype=self.kv_tier_dtype,
        )

    def engine_config(self) -> EngineConfig:
        from workers.engine.config import EngineConfig

        return self._project(
            EngineConfig,
            cache_size_bytes=int(self.cache_size),
            warm_cache_size_bytes=int(self.warm_cache_size),
        )

    def api_config(self) -> ApiConfig:
        from api.config import ApiConfig
        from api.tenants import parse_pairs

        return self._project(
            ApiConfig,
            served_models=(self.served_model,),
            redis_url=self.queue_url,
            api_keys=parse_pairs(self.api_keys),
            job_timeout_s=float(self.job_time_limit_s),
            # The worker applies Settings.default_max_tokens, capped by the room the context
            # leaves; the API fixing it here would skip that cap.
            default_max_tokens=None,
            files_dir=self.files_dir or self.cache_dir / "files",
            files_max_bytes=int(self.files_max_bytes),
            tenant_max_file_bytes=int(self.tenant_max_file_bytes),
            redis_tier=self.redis_tier_on,
        )

    def _project(self, config: type[_Config], **derived: Any) -> _Config:
        """`config` (a dataclass) with every field that Settings has by name, then `derived`."""
        fields = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
        same = {name: getattr(self, name) for name in fields & type(self).model_fields.keys()}
        return config(**{**same, **derived})


def _validated(cls: type[_S], values: dict[str, Any], from_env: Mapping[str, Any]) -> _S:
    try:
        return cls(**values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = str(error["loc"][0]) if error["loc"] else "?"
            where = f"{ENV_PREFIX}{name.upper()}" if name in from_env else name
            problems.append(f"{where}={error.get('input')!r}: {error['msg']}")
        raise SettingsError("bad setting: " + "; ".join(problems)) from None
