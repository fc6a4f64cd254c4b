"""What a lossy cold tier costs and buys: for each tier dtype, bytes per block, fetch rate, and how
often greedy continuations of prompts whose prefix blocks come from that tier still match the ones
from the exact tier (share identical, mean first divergence, KL of the first next-token
distribution). Prompts are random token ids (a hard case: flat distributions diverge sooner)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import torch

from broker.sampling import SamplingParams
from kvstore.chain import chain, chain_root
from kvstore.redis.tier import RedisTier
from kvstore.tiers.quant import TIER_DTYPES, encoded_nbytes
from kvstore.tiers.stored_block import StoredBlock
from ops.bench.engine.target import EngineTarget
from ops.redis.server import RedisServer
from ops.settings import Settings
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import LoadedModel, load_model
from workers.tiers.prefetch import prefetch

BATCH = 32


def _engine(settings: Settings, loaded: LoadedModel, batch: int, prompt_len: int, gen: int) -> LLMEngine:
    config = settings.engine_config()
    per_seq = (prompt_len + gen) * 2 * loaded.model.config.num_hidden_layers * 4096  # generous bound
    config = dataclasses.replace(
        config,
        cache_size_bytes=max(config.cache_size_bytes, 2 * batch * per_seq),
        warm_cache_size_bytes=max(config.warm_cache_size_bytes, 2 * batch * per_seq),
    )
    return build_engine(config, loaded)


def _first_logprobs(engine: LLMEngine) -> dict[str, torch.Tensor]:
    """Log-probabilities of each request's first sampled position, recorded as the engine samples."""
    seen: dict[str, torch.Tensor] = {}
    inner = engine.executor.sampler.sample_isolated

    def record(logits: torch.Tensor, seqs: list[Any]) -> Any:
        for row, seq in zip(logits, seqs, strict=True):
            seen.setdefault(seq.request_id, row.float().log_softmax(-1).cpu())
        return inner(logits, seqs)

    engine.executor.sampler.sample_isolated = record  # type: ignore[method-assign]
    return seen


def _continue(
    engine: LLMEngine, tier: RedisTier, prompts: list[list[int]], gen: int
) -> tuple[list[list[int]], list[torch.Tensor], float, int]:
    """Greedy continuations with every prefix block loaded from ``tier``; fetch seconds, blocks."""
    seen = _first_logprobs(engine)
    started = time.perf_counter()
    fetched = sum(prefetch(EngineTarget(engine), tier, p, "") for p in prompts)
    fetch_s = time.perf_counter() - started
    outs = engine.generate(prompts, SamplingParams(max_tokens=gen, ignore_eos=True))
    order = sorted(seen, key=lambda rid: int(rid.rsplit("-", 1)[1]))
    return [list(o.token_ids) for o in outs], [seen[r] for r in order], fetch_s, fetched


def run_tier_dtype_bench(settings: Settings, quick: bool) -> dict[str, Any]:
    n, prompt_len, gen = (16, 65, 16) if quick else (200, 65, 32)
    loaded = load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)
    vocab = int(loaded.model.config.vocab_size)
    gen_ = torch.Generator().manual_seed(11)
    prompts = [torch.randint(100, vocab, (prompt_len,), generator=gen_).tolist() for _ in range(n)]
    batches = [prompts[i : i + BATCH] for i in range(0, n, BATCH)]
    results: dict[str, Any] = {"model": settings.served_model, "quick": quick, "prompts": n, "tokens": gen}
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kvferry-tierdtype-") as tmp, RedisServer(Path(tmp)) as server:
        client = redis.Redis.from_url(server.url)
        source = _engine(settings, loaded, BATCH, prompt_len, gen)  # computes every prefix once
        fmt = source.served.kv_format
        tiers = {d: RedisTier(client, fmt, 16 * 1024**3, tier_dtype=d) for d in TIER_DTYPES}
        bs = source.pool.block_size
        for batch in batches:
            source.generate(batch, SamplingParams(max_tokens=1, ignore_eos=True))
            for p in batch:
                n_blocks = (len(p) - 1) // bs
                hashes = chain(p[: n_blocks * bs], bs, loaded.fingerprint, "")
                blocks = [_stored(source, hashes, p, i) for i in range(n_blocks)]
                for tier in tiers.values():
                    tier.put(blocks)
        del source
        reference: tuple[list[list[int]], list[torch.Tensor]] | None = None
        for dtype, tier in tiers.items():
            outs: list[list[int]] = []
            logps: list[torch.Tensor] = []
            fetch_s, fetched = 0.0, 0
            for batch in batches:
                engine = _engine(settings, loaded, BATCH, prompt_len, gen)
                o, lp, f_s, f_n = _continue(engine, tier, batch, gen)
                outs, logps, fetch_s, fetched = outs + o, logps + lp, fetch_s + f_s, fetched + f_n
                del engine
            row: dict[str, Any] = {
                "bytes_per_block": encoded_nbytes(fmt, tier.tier_dtype),
                "bytes_vs_exact": encoded_nbytes(fmt, tier.tier_dtype) / fmt.nbytes,
                "blocks_fetched": fetched,
                "fetch_mb_s": fetched * fmt.nbytes / fetch_s / 1e6 if fetch_s else 0.0,
            }
            if reference is None:
                reference = (outs, logps)
            row.update(_quality(reference, outs, logps))
            rows[dtype] = row
            print(
                f"  {dtype:>5}: {row['bytes_vs_exact']:.2f} x bytes, fetch {row['fetch_mb_s']:.0f} MB/s, "
                f"identical {row['identical_share']:.1%}, "
                f"first divergence {row['mean_first_divergence']:.1f}, "
                f"KL {row['mean_first_kl']:.2e}",
                flush=True,
            )
    results["dtypes"] = rows
    return results


def _stored(engine: LLMEngine, hashes: list[bytes], prompt: list[int], i: int) -> StoredBlock:
    """Block i of the prompt as the engine computed it: from its warm tier, else its pool."""
    block = engine.tiers.warm.peek(hashes[i]) if engine.tiers is not None else None
    if block is not None:
        return block
    bs = engine.pool.block_size
    cached = engine.pool.get_cached_block(hashes[i], prompt[i * bs : (i + 1) * bs])
    assert cached is not None, "a prefix block left both the pool and the warm tier"
    parent = hashes[i - 1] if i else chain_root(engine.served.loaded.fingerprint, "")
    kv = engine.executor.kv_cache.read_block(cached.block_id)
    return StoredBlock(hashes[i], parent, tuple(prompt[i * bs : (i + 1) * bs]), kv)


def _quality(
    reference: tuple[list[list[int]], list[torch.Tensor]], outs: list[list[int]], logps: list[torch.Tensor]
) -> dict[str, float]:
    ref_outs, ref_logps = reference
    firsts = []
    for a, b in zip(ref_outs, outs, strict=True):
        firsts.append(next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a)))
    kls = [float((p.exp() * (p - q)).sum()) for p, q in zip(ref_logps, logps, strict=True)]
    return {
        "identical_share": sum(a == b for a, b in zip(ref_outs, outs, strict=True)) / len(outs),
        "mean_first_divergence": sum(firsts) / len(firsts),
        "mean_first_kl": sum(kls) / len(kls),
    }
