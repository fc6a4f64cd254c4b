"""Session fixtures shared by every test package: the model cache and the real SmolLM2 model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.engine.model_loader import LoadedModel, load_model


@pytest.fixture(scope="session")
def kvferry_cache_dir() -> Path:
    """Where converted models live; persists across runs so only the first one converts (~30 s)."""
    return Path(os.environ.get("KVFERRY_CACHE_DIR") or Path.home() / ".cache" / "kvferry")


@pytest.fixture(scope="session")
def smollm2(kvferry_cache_dir: Path) -> LoadedModel:
    """The real SmolLM2-135M-Instruct, fp32 on CPU. Engines built on it switch its attention to
    paged attention, so never use it as an HF reference (see `smollm2_reference`)."""
    return load_model("smollm2", "float32", "cpu", kvferry_cache_dir)


@pytest.fixture(scope="session")
def tokenizer(smollm2: LoadedModel) -> object:
    """SmolLM2's tokenizer (vocab 49152): the engine's detokenizer needs a real one."""
    return smollm2.tokenizer
