"""Bad requests raise typed errors and leave nothing behind; aborts free every block."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from broker.errors import InvalidRequestError, PromptTooLongError, UnknownModelError
from broker.sampling import SamplingParams
from tests.workers._helpers import (
    NO_EOS,
    VOCAB,
    TinyModel,
    assert_tokens,
    make_engine,
    random_prompt,
    run_checked,
)
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import load_model, wrap_model
from workers.engine.requests.request import GenerationRequest

PARAMS = SamplingParams(max_tokens=8, **NO_EOS)


def _assert_clean(engine: LLMEngine) -> None:
    assert not engine.has_unfinished()
    assert engine.pool.stats().blocks_used == 0, engine.pool.stats()
    engine.check_integrity()


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "error", "param"),
    [
        ([], 8, InvalidRequestError, "prompt"),
        ([5, -1, 7], 8, InvalidRequestError, "prompt"),
        ([5, VOCAB, 7], 8, InvalidRequestError, "prompt"),
        ([5, 2.0, 7], 8, InvalidRequestError, "prompt"),
        (list(range(64)), 8, PromptTooLongError, "prompt"),  # context 64 leaves no output token
        (list(range(100)), 8, PromptTooLongError, "prompt"),
        (list(range(60)), 5, PromptTooLongError, "max_tokens"),  # 60 + 5 > 64
        (list(range(48)), 1, PromptTooLongError, "prompt"),  # 48 + 1 tokens need 4 of 3 blocks
    ],
    ids=["empty", "negative-id", "id-out-of-vocab", "float-id", "fills-context", "over-context",
         "plus-max-tokens-over-context", "over-pool"],
)  # fmt: skip
def test_bad_request_raises_and_leaves_nothing(
    tiny: TinyModel, prompt: list[int], max_tokens: int, error: type[Exception], param: str
) -> None:
    engine = make_engine(tiny.loaded, num_blocks=3, max_model_len=64)

    with pytest.raises(error) as raised:
        engine.add_request(GenerationRequest("bad", prompt, SamplingParams(max_tokens=max_tokens, **NO_EOS)))

    assert type(raised.value) is error and raised.value.param == param  # type: ignore[attr-defined]
    _assert_clean(engine)
    good = random_prompt(random.Random(40), 20)
    out = run_checked(engine, {"bad": (good, PARAMS)})["bad"]  # the id is free again too
    assert_tokens(out.token_ids, tiny.expected(good, 8), "good request after a rejected one")


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_non_positive_max_tokens_is_rejected(max_tokens: int) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        SamplingParams(max_tokens=max_tokens)
    assert raised.value.param == "max_tokens"
    if max_tokens == 0:  # the prompt alone, for its logprobs (echo)
        SamplingParams(max_tokens=0, prompt_logprobs=0)


def test_duplicate_request_id_is_rejected_without_harming_the_first(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(41), 20)
    engine = make_engine(tiny.loaded, num_blocks=8)
    engine.add_request(GenerationRequest("same", prompt, PARAMS))
    engine.step()

    with pytest.raises(InvalidRequestError):
        engine.add_request(GenerationRequest("same", random_prompt(random.Random(42), 5), PARAMS))

    out = run_checked(engine)["same"]
    assert_tokens(out.token_ids, tiny.expected(prompt, 8), "the first 'same' request")


def test_unknown_model_name_raises(kvferry_cache_dir: Path) -> None:
    with pytest.raises(UnknownModelError):
        load_model("no-such-model", "float32", "cpu", kvferry_cache_dir)


def test_unsupported_architecture_raises(tokenizer: object) -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB))
    with pytest.raises(UnknownModelError):
        wrap_model(gpt2, tokenizer, "gpt2", "gpt2")


def test_abort_mid_generation_frees_every_block(tiny: TinyModel) -> None:
    rng = random.Random(43)
    prompts = {"a": random_prompt(rng, 40), "b": random_prompt(rng, 25), "queued": random_prompt(rng, 9)}
    engine = make_engine(tiny.loaded, num_blocks=16, max_num_seqs=2)
    params = SamplingParams(max_tokens=50, **NO_EOS)
    for rid, prompt in prompts.items():
        engine.add_request(GenerationRequest(rid, prompt, params))
    for _ in range(5):
        engine.step()
        engine.check_integrity()

    queued = engine.abort_request("queued")  # never admitted
    a = engine.abort_request("a")  # mid-decode
    assert engine.abort_request("a") is None and engine.abort_request("nope") is None
    engine.check_integrity()
    b = engine.abort_request("b")

    assert queued is not None and queued.finish_reason == "abort" and queued.token_ids == ()
    assert a is not None and b is not None
    assert (a.finished, a.finish_reason, len(a.token_ids)) == (True, "abort", 5)
    assert_tokens(a.token_ids, tiny.expected(prompts["a"], 5), "aborted after 5 tokens")
    _assert_clean(engine)


def test_abort_during_chunked_prefill_then_resubmit(tiny: TinyModel) -> None:
    """Aborting a half-prefilled prompt keeps its committed blocks valid: resubmitting hits them.
    A decoding neighbour keeps a sampling row in every step."""
    rng = random.Random(44)
    long, short = random_prompt(rng, 90), random_prompt(rng, 5)
    engine = make_engine(tiny.loaded, num_blocks=16, max_num_batched_tokens=33)
    engine.add_request(GenerationRequest("short", short, SamplingParams(max_tokens=40, **NO_EOS)))
    engine.step()
    engine.add_request(GenerationRequest("long", long, PARAMS))
    engine.step()  # short's decode + 32 tokens of long
    engine.step()  # short's decode + 32 more
    engine.check_integrity()

    engine.abort_request("long")
    engine.check_integrity()
    outs = run_checked(engine, {"again": (long, PARAMS)})

    assert outs["again"].cached_tokens == 64
    assert_tokens(outs["again"].token_ids, tiny.expected(long, 8), "90 tokens after an aborted prefill")
    assert_tokens(outs["short"].token_ids, tiny.expected(short, 40), "the neighbour")


def test_generate_with_a_bad_prompt_in_the_batch_leaves_nothing(tiny: TinyModel) -> None:
    """generate() validates while it queues: a bad second prompt must not strand the first."""
    good = random_prompt(random.Random(45), 12)
    engine = make_engine(tiny.loaded, num_blocks=8)

    with pytest.raises(InvalidRequestError):
        engine.generate([good, []], PARAMS)

    _assert_clean(engine)
    out = engine.generate([good], PARAMS)[0]
    assert_tokens(out.token_ids, tiny.expected(good, 8), "a good batch after a rejected one")
