"""An int8 KV pool (issue 41, opt-in `kv_cache_dtype="int8"`): the fingerprint covers it, every
reader of the pool dequantises it (the decode kernel, the fused stack, the modules' paged
attention), and the cache stays invisible: a turn whose history comes from the warm tier or from
another engine's pack gives the tokens of the same turn on an engine that kept it."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from broker.sampling import SamplingParams
from kvstore.pool import int8_rows
from kvstore.tiers.codec import decode_pack
from ops.settings import Settings
from tests.workers._helpers import (
    NO_EOS,
    TinyModel,
    make_engine,
    move_history,
    moved_and_kept,
    random_prompt,
    run_checked,
)
from workers.engine.kernels import paged_decode
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.precision import Precision
from workers.engine.requests.output import RequestOutput

INT8 = {"kv_cache_dtype": "int8"}  # fp32 weights: runs on any CPU
PATHS = {
    "fused": {},
    "kernel": {"fused_decode": False},  # the modules, decodes in place by the kernel
    "modules": {"fused_decode": False, "decode_kernel": False},  # gather + SDPA throughout
}


def test_int8_is_opt_in_and_in_the_chain_root() -> None:
    assert Settings.from_env({"KVFERRY_KV_CACHE_DTYPE": "int8"}).engine_config().kv_cache_dtype == "int8"
    assert Settings.from_env({}).engine_config().kv_cache_dtype == "auto"
    assert Precision.resolve("auto", "int8", "cpu").kv == "int8"
    assert Precision.resolve("float32", "auto", "cpu").kv == "float32"
    assert Precision("float32", "int8").tag == "+w-f32+kv-int8"
    assert Precision("bfloat16", "int8").tag == "+w-bf16+kv-int8"


def test_the_decode_kernel_reads_an_int8_pool_as_its_dequantised_copy() -> None:
    if not paged_decode.available():
        pytest.skip("the CPU kernels do not build here")
    gen = torch.Generator().manual_seed(3)
    bs, nblocks, hkv, groups, d = 4, 10, 2, 3, 64
    pool = int8_rows.quantize(torch.randn(2, nblocks * bs, hkv, d, generator=gen) * 3)
    blocks = torch.randperm(nblocks, generator=gen)[:6].view(2, 3)
    lens = torch.tensor([11, 6])
    query = torch.randn(2, hkv * groups, d, generator=gen)
    got, want = torch.empty_like(query), torch.empty_like(query)
    paged_decode.paged_decode(got, query, pool, blocks, lens, bs, d**-0.5)
    paged_decode.paged_decode(want, query, int8_rows.dequantize(pool), blocks, lens, bs, d**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="D \\+ 4"):  # an int8 pool without its scales
        paged_decode.paged_decode(got, query, pool[..., :d].contiguous(), blocks, lens, bs, d**-0.5)


def _engine(tiny: TinyModel, num_blocks: int, path: str, **config: Any) -> LLMEngine:
    return make_engine(tiny.loaded, num_blocks=num_blocks, **INT8, **PATHS[path], **config)


def _warm_and_kept(evicting: LLMEngine, keeping: LLMEngine) -> tuple[RequestOutput, RequestOutput]:
    """One turn over a 64-token history: `evicting` pushed it out to its warm tier, `keeping` holds it."""
    rng = random.Random(41)
    system = random_prompt(rng, 64)  # 4 full blocks
    first, again = [*system, *random_prompt(rng, 9)], [*system, *random_prompt(rng, 11)]
    params = SamplingParams(max_tokens=8, **NO_EOS)
    for engine in (evicting, keeping):
        run_checked(engine, {"first": (first, params)})
    for i in range(3):
        run_checked(evicting, {f"filler{i}": (random_prompt(rng, 70), params)})
    got = run_checked(evicting, {"again": (again, params)})["again"]
    kept = run_checked(keeping, {"again": (again, params)})["again"]
    assert got.warm_tokens == 64 and kept.pool_tokens == 64
    return got, kept


@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_writes_an_int8_pool_and_its_history_from_the_warm_tier_is_invisible(
    tiny_model: Any, path: str
) -> None:
    tiny = tiny_model("qwen3" if path == "fused" else "llama")
    evicting = _engine(tiny, 8, path, warm_cache_size_bytes=1 << 20)
    keeping = _engine(tiny, 64, path)
    assert evicting.executor.kv_cache.tensor.dtype == torch.int8
    assert evicting.served.fingerprint.endswith("+w-f32+kv-int8")
    assert evicting.served.kv_format.dtype == "int8" and evicting.stats().kv_cache_dtype == "int8"
    runner = evicting.executor.runner
    assert runner.decode_kernel == (path != "modules" and paged_decode.available())
    assert (runner.fused is not None) == (path == "fused" and paged_decode.available())
    got, kept = _warm_and_kept(evicting, keeping)
    assert got.token_ids == kept.token_ids


def test_int8_blocks_moved_through_a_pack_give_the_tokens_of_the_engine_that_made_them(
    tiny_model: Any,
) -> None:
    tiny = tiny_model("llama")
    rng = random.Random(42)
    history = random_prompt(rng, 48)  # 3 full blocks
    turn = [*history, *random_prompt(rng, 7)]
    params = SamplingParams(max_tokens=8, **NO_EOS)
    source = _engine(tiny, 32, "fused")
    target = _engine(tiny, 32, "fused", warm_cache_size_bytes=1 << 20)
    assert target.tiers is not None
    pack = move_history(source, target, history)
    # an engine of the same weights with an fp32 pool refuses the pack (another chain root and dtype)
    fp32 = make_engine(tiny.loaded, num_blocks=4)
    refused = decode_pack(fp32.served.kv_format, pack)
    assert not refused.blocks and refused.reason is not None
    got, kept = moved_and_kept(source, target, history, turn, params)
    assert got.token_ids == kept.token_ids


def test_the_fused_stack_quantises_as_the_modules_do(tiny_model: Any) -> None:
    """The same prompt through the fused stack and through the modules: the same rows of layer 0
    (whose K/V differ only by the GEMMs' float noise; a later layer's inputs carry the first's
    quantisation), up to one int8 step where a value sits on a rounding boundary."""
    if not paged_decode.available():
        pytest.skip("the CPU kernels do not build here")
    tiny = tiny_model("llama")
    prompt = random_prompt(random.Random(7), 40)
    pools = []
    for path in ("fused", "modules"):
        engine = _engine(tiny, 8, path)
        run_checked(engine, {"p": (prompt, SamplingParams(max_tokens=4, **NO_EOS))})
        pools.append(engine.executor.kv_cache.tensor[0, :, :43].clone())
    fused, modules = pools
    scales = [p[..., 16:].contiguous().view(torch.float32) for p in pools]
    torch.testing.assert_close(scales[0], scales[1], rtol=1e-4, atol=1e-6)
    steps = (fused[..., :16].int() - modules[..., :16].int()).abs()
    assert steps.max() <= 1 and steps.float().mean() < 0.01


@pytest.mark.parametrize("path", list(PATHS))
def test_an_int8_pool_decodes_as_the_fp32_one_does(tiny_model: Any, path: str) -> None:
    """Quantised K/V (an error of at most half a step of each row's absmax / 127) leave the tiny
    model's greedy tokens as they are for its first steps (this random model's trajectories part
    after 5 to 8 tokens, measured): a reader that dropped the scales, or read a row's bytes as
    another's, would differ from the first token."""
    tiny = tiny_model("llama")
    rng = random.Random(43)
    prompts = {
        f"p{i}": (random_prompt(rng, n), SamplingParams(max_tokens=12, **NO_EOS))
        for i, n in enumerate((5, 23, 40))
    }
    fp32 = run_checked(make_engine(tiny.loaded, num_blocks=32, **PATHS[path]), prompts)
    int8 = run_checked(_engine(tiny, 32, path), prompts)
    agree = [
        next(
            (i for i, (a, b) in enumerate(zip(int8[r].token_ids, fp32[r].token_ids, strict=True)) if a != b),
            12,
        )
        for r in prompts
    ]
    assert min(agree) >= 4, agree
