from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.config import ApiConfig
from broker.celery_app import BrokerConfig
from broker.defaults import GiB, MiB
from ops.settings import Settings, SettingsError, parse_size
from workers.engine.config import EngineConfig
from workers.tiers.config import TierConfig


def test_parse_size() -> None:
    assert parse_size("512M") == 512 * 1024**2
    assert parse_size("1.5G") == int(1.5 * 1024**3)
    assert parse_size("4096") == 4096
    assert parse_size("2GiB") == 2 * 1024**3
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_env_then_overrides() -> None:
    env = {
        "KVFERRY_MODEL": "/models/x",
        "KVFERRY_BLOCK_SIZE": "32",
        "KVFERRY_ENABLE_PREFIX_CACHING": "false",
        "KVFERRY_CACHE_DIR": "/tmp/kv",
    }
    s = Settings.from_env(env, block_size=8, max_num_seqs=None)
    assert s.model == "/models/x" and s.block_size == 8 and s.max_num_seqs == 32
    assert s.enable_prefix_caching is False and s.cache_dir == Path("/tmp/kv")
    config = s.engine_config()
    assert config.block_size == 8 and config.cache_size_bytes == 1024**3


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="KVFERRY_BLOCK_SIZE"):
        Settings.from_env({"KVFERRY_BLOCK_SIZE": "big"})
    with pytest.raises(ValueError, match="block_size"):
        Settings.from_env({}, block_size=0).engine_config()


# Every KVFERRY_* variable docs/configuration.md documents, with its default: renaming one breaks deployments.
DOCUMENTED = {
    "MODEL": "smollm2",
    "SERVED_MODEL_NAME": None,
    "CACHE_SIZE": 1 * GiB,
    "WARM_CACHE_SIZE": 256 * MiB,
    "REDIS_CACHE_SIZE": 2 * GiB,
    "SESSION_TTL_S": 3600,
    "TENANT_KV_QUOTA": None,
    "BLOCK_SIZE": 16,
    "MAX_NUM_SEQS": 32,
    "MAX_NUM_BATCHED_TOKENS": 2048,
    "MAX_MODEL_LEN": None,
    "ENABLE_PREFIX_CACHING": True,
    "TORCH_THREADS": None,
    "PACKED_LINEAR": True,
    "DECODE_KERNEL": True,
    "FUSED_DECODE": True,
    "PREFILL_BATCH_HOLD": 0.0,
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "KV_REDIS_URL": None,
    "KV_SHARDS": 0,
    "WORKER_CONCURRENCY": 36,
    "JOB_TIME_LIMIT_S": 1800,
    "HEARTBEAT_TTL_S": 3,
    "ROUTING": "cache-aware",
    "API_KEY": None,
    "API_KEYS": None,
    "API_KEYS_FILE": None,
    "API_KEYS_RELOAD_S": 1.0,
    "BATCH_LEASE_TTL_S": 5.0,
    "TENANT_MAX_JOBS": 0,
    "DEFAULT_MAX_TOKENS": 1024,
    "JOB_TTL_S": 86400,
    "API_HOST": "127.0.0.1",
    "API_PORT": 8000,
    "API_KEEP_ALIVE_S": 65,
    "FLOWER_PORT": 5555,
    "TOOL_CALL_PARSER": "hermes",
    "CACHE_DIR": Path.home() / ".cache" / "kvferry",
}


def test_documented_variables_and_defaults() -> None:
    s = Settings()
    for name, default in DOCUMENTED.items():
        assert getattr(s, name.lower()) == default, name
    env = {"KVFERRY_" + n: str(v).lower() if v is True else str(v) for n, v in DOCUMENTED.items() if v}
    assert Settings.from_env(env) == s  # each variable reaches its setting
    assert Settings.from_env({"KVFERRY_TORCH_THREADS": "3"}).torch_threads == 3
    assert Settings.from_env({"KVFERRY_PACKED_LINEAR": "false"}).engine_config().packed_linear is False
    assert Settings.from_env({"KVFERRY_DECODE_KERNEL": "false"}).engine_config().decode_kernel is False
    assert Settings.from_env({"KVFERRY_FUSED_DECODE": "false"}).engine_config().fused_decode is False


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512M", 512 * MiB),
        ("2G", 2 * GiB),
        ("1.5G", int(1.5 * GiB)),
        ("512MB", 512 * MiB),  # binary whatever the spelling, as docs/configuration.md says (pydantic: 10**6)
        ("512MiB", 512 * MiB),
        ("64k", 64 * 1024),
        ("0", 0),
        (1048576, 1048576),
    ],
)
def test_sizes_are_binary(text: str | int, size: int) -> None:
    assert parse_size(text) == size
    assert Settings(cache_size=text).cache_size == size  # type: ignore[arg-type]
    assert Settings.from_env({"KVFERRY_REDIS_CACHE_SIZE": str(text)}).redis_cache_size == size


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KVFERRY_CACHE_SIZE", "lots"),
        ("KVFERRY_TENANT_KV_QUOTA", "-1G"),
        ("KVFERRY_ENABLE_PREFIX_CACHING", "maybe"),
        ("KVFERRY_ROUTING", "fastest"),
        ("KVFERRY_DEBUG_SLOW_STEP_S", "slow"),
        ("KVFERRY_API_PORT", "80.5"),
    ],
)
def test_bad_values_name_the_variable_and_value(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=f"{variable}='{re.escape(value)}'"):
        Settings.from_env({variable: value})


def test_bad_overrides_name_the_setting() -> None:
    with pytest.raises(SettingsError, match="cache_size='lots'") as info:
        Settings.from_env({"KVFERRY_CACHE_SIZE": "1G"}, cache_size="lots")
    assert "KVFERRY_" not in str(info.value)  # the flag was wrong, not the variable
    with pytest.raises(SettingsError, match="no_such_setting"):
        Settings.from_env({}, no_such_setting=1)
    with pytest.raises(SettingsError, match="block_size='x'"):
        Settings().with_overrides(block_size="x")


def test_empty_means_unset_and_paths_expand() -> None:
    env = {"KVFERRY_API_KEY": "", "KVFERRY_MAX_MODEL_LEN": "", "KVFERRY_CACHE_DIR": "~/kv"}
    s = Settings.from_env(env)
    assert s.api_key is None and s.max_model_len is None
    assert s.cache_dir == Path.home() / "kv"
    assert Settings.from_env({"KVFERRY_API_KEYS_FILE": "~/keys"}).api_keys_file == Path.home() / "keys"


def test_only_from_env_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVFERRY_BLOCK_SIZE", "8")
    assert Settings().block_size == 16  # Settings(...) is defaults and arguments, nothing else
    assert Settings.from_env().block_size == 8


def test_frozen_and_round_trips_through_env() -> None:
    s = Settings.from_env(
        {"KVFERRY_TENANT_KV_QUOTA": "1.5G", "KVFERRY_ENABLE_PREFIX_CACHING": "off"},
        api_keys_file=Path("/k"),
        routing="shared",
    )
    with pytest.raises(ValidationError):
        s.block_size = 1
    assert Settings.from_env(s.to_env()) == s
    assert s.with_overrides(cache_size="1G", model=None).cache_size == GiB  # None: keep
    assert s.with_overrides(cache_size="1G").tenant_kv_quota == int(1.5 * GiB)


def test_part_configs_take_their_defaults_from_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each part's config, bare, is what default Settings build: the defaults agree (they are
    broker/defaults.py's), except what a bare engine has off unless asked (a worker gets Settings')."""
    monkeypatch.delenv("KVFERRY_DTYPE", raising=False)  # tests/conftest.py pins the suite to fp32
    s = Settings()
    assert BrokerConfig() == s.broker_config()
    assert ApiConfig() == s.api_config()
    assert TierConfig() == s.tier_config()
    assert EngineConfig() == dataclasses.replace(
        s.engine_config(), warm_cache_size_bytes=0, default_max_tokens=None
    )


def test_settings_reach_each_part() -> None:
    env = {
        "KVFERRY_HEARTBEAT_TTL_S": "8",
        "KVFERRY_JOB_TTL_S": "60",
        "KVFERRY_REDIS_CACHE_SIZE": "1G",
        "KVFERRY_TENANT_KV_QUOTA": "256M",
        "KVFERRY_SESSION_TTL_S": "5",
        "KVFERRY_SERVED_MODEL_NAME": "m",
        "KVFERRY_JOB_TIME_LIMIT_S": "30",
    }
    s = Settings.from_env(env)
    broker = s.broker_config()
    assert (broker.heartbeat_ttl_s, broker.heartbeat_interval_s, broker.result_ttl_s) == (8, 2.0, 60)
    assert s.tier_config() == TierConfig(GiB, 5, 256 * MiB)
    api = s.api_config()
    assert api.served_models == ("m",) and api.job_timeout_s == 30.0 and api.default_max_tokens is None
    assert s.engine_config().served_model_name == "m" and s.engine_config().warm_cache_size_bytes == 256 * MiB


def test_a_new_setting_is_one_field() -> None:
    """What adding a setting takes: a field (here on a subclass; really in broker/defaults.py). Its
    variable, to_env, overrides and a same-named field of a part's config follow by themselves."""

    class Grown(Settings):
        kv_write_queue: int = 64

    @dataclasses.dataclass(frozen=True)
    class Part:
        kv_write_queue: int = 64
        block_size: int = 16

    s = Grown.from_env({"KVFERRY_KV_WRITE_QUEUE": "8", "KVFERRY_BLOCK_SIZE": "32"})
    assert s._project(Part) == Part(8, 32)
    assert s.to_env()["KVFERRY_KV_WRITE_QUEUE"] == "8"
    assert s.with_overrides(kv_write_queue=9).kv_write_queue == 9
