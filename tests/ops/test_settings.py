from __future__ import annotations

from pathlib import Path

import pytest

from ops.settings import Settings, parse_size


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
    assert config.block_size == 8 and config.cache_size_bytes == 512 * 1024**2


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="KVFERRY_BLOCK_SIZE"):
        Settings.from_env({"KVFERRY_BLOCK_SIZE": "big"})
    with pytest.raises(ValueError, match="block_size"):
        Settings.from_env({}, block_size=0).engine_config()
