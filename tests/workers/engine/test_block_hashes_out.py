"""A finished request carries the chained hashes the engine computed for its full blocks, so the
session keeper hashes only what follows them: the chain it builds from them is the very chain
kvstore.chain computes from scratch, for a plain turn, a turn on a kept tail and a resumed one."""

from __future__ import annotations

import random

from broker.sampling import SamplingParams
from kvstore.chain import chain
from tests.workers._helpers import TinyModel, make_engine, random_prompt
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest


def _finish(
    engine: LLMEngine, rid: str, prompt: list[int], params: SamplingParams, **kw: object
) -> RequestOutput:
    engine.add_request(GenerationRequest(rid, prompt, params, **kw))  # type: ignore[arg-type]
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final = out
    assert final is not None
    return final


def _check(engine: LLMEngine, prompt: list[int], final: RequestOutput, salt: str = "") -> None:
    bs, fp = engine.pool.block_size, engine.served.loaded.fingerprint
    tokens = [*prompt, *final.token_ids]
    scratch = chain(tokens, bs, fp, salt)
    assert list(final.block_hashes) == scratch[: len(final.block_hashes)]
    assert chain(tokens, bs, fp, salt, final.block_hashes) == scratch
    assert chain(prompt, bs, fp, salt, final.block_hashes) == chain(prompt, bs, fp, salt)


def test_finished_requests_carry_the_engines_chain(tiny: TinyModel) -> None:
    rng = random.Random(11)
    engine = make_engine(tiny.loaded, num_blocks=32)
    params = SamplingParams(max_tokens=23, ignore_eos=True)
    turn1 = random_prompt(rng, 37)
    r1 = _finish(engine, "t1", turn1, params, keep_tail=True, cache_salt="s")
    assert len(r1.block_hashes) == (37 + 23 - 1) // engine.pool.block_size  # the computed full blocks
    _check(engine, turn1, r1, "s")
    turn2 = [*turn1, *r1.token_ids, *random_prompt(rng, 9)]  # on the kept tail, prefix hits
    r2 = _finish(engine, "t2", turn2, params, keep_tail=True, cache_salt="s")
    assert r2.cached_tokens > 0
    _check(engine, turn2, r2, "s")
    # a redelivered job: 5 tokens already made elsewhere
    resumed = _finish(engine, "t3", turn1, params, output_token_ids=list(r1.token_ids[:5]))
    assert resumed.token_ids == r1.token_ids
    _check(engine, turn1, resumed)


def test_chain_reuses_known_hashes_and_hashes_the_rest() -> None:
    tokens = list(range(50))
    full = chain(tokens, 16, "fp", "salt")
    assert len(full) == 3 and chain(tokens, 16, "fp", "salt", full[:1]) == full
    assert chain(tokens, 16, "fp", "other") != full  # the salt roots the chain
    assert chain(tokens[:40], 16, "fp", "salt", full) == full[:2]  # known past the tokens: cut
    fake = [b"x" * 32]
    assert chain(tokens, 16, "fp", "salt", fake)[0] == fake[0]  # known is trusted, not re-hashed
