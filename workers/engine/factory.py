"""build_engine: the one place an engine's parts are made and wired (a worker, the CLI, the
benchmarks and the tests all build it here). Nothing here runs per step."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from kvstore.layout import KVFormat
from kvstore.pool.block_pool import BlockPool
from kvstore.pool.kv_cache import KVCache
from kvstore.tiers.warm import WarmTier
from workers.engine.block_manager import BlockManager
from workers.engine.config import EngineConfig
from workers.engine.executor import Executor
from workers.engine.grammar.compiler import GrammarCompiler
from workers.engine.kernels import block_writer
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.kv_layout import kv_layout
from workers.engine.model.loader import LoadedModel, load_model
from workers.engine.model.precision import Precision
from workers.engine.model_runner import ModelRunner
from workers.engine.requests.detokenizer import Detokenizer
from workers.engine.sampling.postprocess import Postprocessor
from workers.engine.sampling.sampler import Sampler
from workers.engine.scheduling.scheduler import Scheduler
from workers.engine.served import ServedModel
from workers.engine.stats.report import EngineReport
from workers.engine.tiers.bridge import ColdWriter, TierBridge

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "kvferry"


def bytes_per_block(loaded: LoadedModel, block_size: int, kv_dtype: torch.dtype | None = None) -> int:
    return kv_layout(loaded, block_size, kv_dtype).bytes_per_block


def build_engine(
    config: EngineConfig,
    model: LoadedModel | None = None,
    cache_dir: Path | None = None,
    cold_writer: Callable[[KVFormat, torch.device], ColdWriter | None] | None = None,
) -> LLMEngine:
    """The engine over `model` (loaded from config.model into cache_dir when None). cold_writer:
    asked, when the engine spills (it has a warm tier), for the writer of its cold tier."""
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    # The precision (model/precision.py): resolved here, applied to the model, part of its fingerprint.
    precision = Precision.resolve(config.dtype, config.kv_cache_dtype, config.device, config.quantization)
    loaded, precision = precision.apply(
        model or load_model(config.model, precision.load_dtype, config.device, cache_dir or DEFAULT_CACHE_DIR)
    )
    device = next(loaded.model.parameters()).device
    layout = kv_layout(loaded, config.block_size, precision.kv_torch)
    kv_cache = KVCache.from_budget(layout, config.cache_size_bytes, device)
    if device.type == "cpu" and block_writer.available():  # loads streamed into the pool
        kv_cache.block_writer = block_writer.write_blocks
    pool = BlockPool(kv_cache.num_blocks, config.block_size, config.enable_prefix_caching)
    kv_format = KVFormat.from_layout(layout, loaded.fingerprint)
    tiers = None
    if config.warm_cache_size_bytes > 0 and config.enable_prefix_caching:
        tiers = TierBridge(pool, kv_cache, kv_format, WarmTier(config.warm_cache_size_bytes))
        writer = cold_writer(kv_format, device) if cold_writer is not None else None
        if writer is not None:
            tiers.attach(writer)
    scheduler = Scheduler(config, BlockManager(pool, loaded.fingerprint), tiers)
    if device.type == "cpu" and torch.get_num_threads() == 1:  # this thread does a step's work alone
        scheduler.cost.clock = time.thread_time
    runner = ModelRunner(
        loaded.model,
        kv_cache,
        packed=config.packed_linear,
        decode_kernel=config.decode_kernel,
        fused_decode=config.fused_decode,
    )
    # Counted after the runner packed the linears: stats() runs right after a job's last step,
    # while its task thread waits for the GIL to publish the result.
    served = ServedModel(
        loaded,
        config.served_model_name or loaded.model_id,
        layout,
        kv_format,
        device,
        min(config.max_model_len or loaded.max_model_len, loaded.max_model_len),
        loaded.weights_bytes,
        GrammarCompiler(loaded.tokenizer, loaded.eos_token_ids),
        precision,
    )
    post = Postprocessor(Detokenizer(loaded.tokenizer), loaded.eos_token_ids, served.max_model_len)
    executor = Executor(kv_cache, runner, Sampler(device, loaded.eos_token_ids))
    report = EngineReport(
        config, served.model_id, served.weights_bytes, kv_cache, scheduler, post, precision.weights_name
    )
    return LLMEngine(config, served, scheduler, executor, post, tiers, report)
