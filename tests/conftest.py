"""Session fixtures shared by every test package: the model cache and the real SmolLM2 model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# torch, transformers and the engine are imported where they are used: under pytest-xdist the
# controller process loads this file too, and runs no test (seconds of imports on a shared CPU)
if TYPE_CHECKING:
    from workers.engine.model.loader import LoadedModel

# The suite compares fp32 outputs with HF fp32 token for token: every engine, worker and stack it
# starts computes in fp32 unless a test asks for another precision (dtype "auto" picks bf16 on a
# CPU with AVX512-BF16 or AMX). Worker processes inherit it. KVFERRY_TEST_DTYPE,
# KVFERRY_TEST_KV_CACHE_DTYPE and KVFERRY_TEST_QUANTIZATION run the workers and stacks of the same
# tests in another precision (docs/operations.md); tests marked `fp32_only` then skip: greedy tokens
# against HF fp32 are an fp32 property (in bf16 and int8 the tiny model's near-tied logits move with
# the kernels a worker races at start-up), and the cache staying invisible in those precisions is
# tested against a kept history in process (tests/workers/engine/test_precision.py,
# test_quantization.py, test_int8_kv.py, tests/workers/kernels/test_skinny_bf16.py).
TEST_PRECISION = {
    "KVFERRY_DTYPE": os.environ.get("KVFERRY_TEST_DTYPE", "float32"),
    "KVFERRY_KV_CACHE_DTYPE": os.environ.get("KVFERRY_TEST_KV_CACHE_DTYPE", "auto"),
    "KVFERRY_QUANTIZATION": os.environ.get("KVFERRY_TEST_QUANTIZATION", "none"),
}
os.environ.update(TEST_PRECISION)
FP32_RUN = (TEST_PRECISION["KVFERRY_DTYPE"], TEST_PRECISION["KVFERRY_QUANTIZATION"]) == (
    "float32",
    "none",
) and (TEST_PRECISION["KVFERRY_KV_CACHE_DTYPE"] in ("auto", "float32"))

# Files whose tests start processes (workers, apis, stacks, clusters): under pytest-xdist they go
# first, so the many quick files fill the gaps at the end instead of one long file running alone;
# the longest of them (`--durations`: each half a minute or more of kills, restarts and chaos, in
# the order of their durations) lead.
_SLOW_FIRST = (
    "tests/ops/test_chaos_batch.py",
    "tests/ops/test_chaos.py",
    "tests/integration/test_exactly_once.py",
    "tests/integration/test_drain.py",
    "tests/ops/test_chaos_failover.py",
    "tests/integration/test_sessions.py",
    "tests/integration/test_fair_dispatch.py",
    "tests/integration/test_batches_faults.py",
    "tests/integration/test_workers.py",
    "tests/integration/test_deferred_writes.py",
    "tests/api/test_fuzz.py",
    "tests/integration/test_batches_api.py",
    "tests/integration/test_kv_cluster.py",
    "tests/integration/test_move_prefetch.py",
    "tests/integration/test_sentinel_failover.py",
    "tests/integration/test_responses_faults.py",
    "tests/integration/",
    "tests/ops/",
    "tests/workers/engine/",
)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test`), each pytest process gets its share of the cores for its
    own torch work (HF references, in-process engines): a full team in every process on a small
    machine oversubscribes it, and OpenMP teams spin on each other's time.

    And `--dist loadfile` hands out the files in the order collected (`_SLOW_FIRST`): by default
    pytest-xdist reorders them by their number of tests, most first, which put the long fault files
    (a test or two each) last, running alone at the end."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    precision = ", ".join(f"{k}={v}" for k, v in TEST_PRECISION.items())
    for item in items:
        marker = item.get_closest_marker("fp32_only")
        if marker is not None and not FP32_RUN:
            why = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            item.add_marker(pytest.mark.skip(reason=f"fp32 only ({why}); this run: {precision}"))
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return  # a plain run keeps the collection order
    root = Path(__file__).resolve().parents[1]

    def slow_first(item: pytest.Item) -> int:
        where = item.path.relative_to(root).as_posix()
        return next((i for i, prefix in enumerate(_SLOW_FIRST) if where.startswith(prefix)), len(_SLOW_FIRST))

    items.sort(key=slow_first)  # stable: each file's tests keep their order


@pytest.fixture(scope="session")
def kvferry_cache_dir() -> Path:
    """Where converted models live; persists across runs so only the first one pays the conversion."""
    return Path(os.environ.get("KVFERRY_CACHE_DIR") or Path.home() / ".cache" / "kvferry")


@pytest.fixture(scope="session", autouse=True)
def cpu_kernels_built() -> bool:
    """The CPU kernels, built once here before any worker process starts (a compile on a fresh
    machine; each worker then loads the built library)."""
    from workers.engine.kernels import paged_decode

    return paged_decode.available()


@pytest.fixture(scope="session")
def smollm2(kvferry_cache_dir: Path) -> LoadedModel:
    """The real SmolLM2-135M-Instruct, fp32 on CPU. Engines built on it switch its attention to
    paged attention, so never use it as an HF reference (see `smollm2_reference`)."""
    from workers.engine.model.loader import load_model

    return load_model("smollm2", "float32", "cpu", kvferry_cache_dir)


@pytest.fixture(scope="session")
def tokenizer(smollm2: LoadedModel) -> object:
    """SmolLM2's tokenizer (vocab 49152): the engine's detokenizer needs a real one."""
    return smollm2.tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: object) -> Path:
    """A tiny random Llama saved as a local HF model directory, with SmolLM2's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        initializer_range=0.5,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(7)
        model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)  # type: ignore[attr-defined]
    return directory
