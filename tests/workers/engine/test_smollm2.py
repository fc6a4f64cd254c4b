"""The real SmolLM2-135M-Instruct: chat prompts token-exact with an independent HF instance."""

from __future__ import annotations

import pytest

from broker.sampling import SamplingParams
from tests.workers._helpers import Reference, assert_tokens, chat_prompt, make_engine, run_checked
from workers.engine.model.loader import LoadedModel

pytestmark = pytest.mark.smollm2

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is in two sentences.",
    "List three primary colours.",
]
SYSTEM = (
    "You are a careful assistant for a railway company. Answer questions about timetables, "
    "tickets and luggage politely and briefly, and never invent train numbers."
)


def test_four_chat_prompts_batched_are_exact(smollm2: LoadedModel, smollm2_reference: Reference) -> None:
    prompts = {f"q{i}": chat_prompt(smollm2.tokenizer, q) for i, q in enumerate(QUESTIONS)}
    engine = make_engine(smollm2, num_blocks=32)
    params = SamplingParams(max_tokens=24)

    outs = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})

    for rid, prompt in prompts.items():
        expected = smollm2_reference.greedy(prompt, 24)
        assert_tokens(outs[rid].token_ids, expected, f"{rid} ({len(prompt)} prompt tokens)")
        assert outs[rid].finish_reason == ("stop" if len(expected) < 24 else "length")
    assert engine.stats().max_batch_seqs == 4


def test_shared_system_prompt_is_cached_and_exact(smollm2: LoadedModel, smollm2_reference: Reference) -> None:
    first = chat_prompt(smollm2.tokenizer, "When does the last train to Lyon leave?", SYSTEM)
    second = chat_prompt(smollm2.tokenizer, "Can I bring a bicycle on board?", SYSTEM)
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert common >= 32, f"the shared system prompt is only {common} tokens"
    engine = make_engine(smollm2, num_blocks=32)
    params = SamplingParams(max_tokens=24)

    out1 = run_checked(engine, {"first": (first, params)})["first"]
    out2 = run_checked(engine, {"second": (second, params)})["second"]

    assert out1.cached_tokens == 0
    assert out2.cached_tokens == common // 16 * 16, f"{common} shared tokens"
    assert_tokens(out1.token_ids, smollm2_reference.greedy(first, 24), "system prompt, first")
    assert_tokens(out2.token_ids, smollm2_reference.greedy(second, 24), "system prompt, second, cached")
    assert engine.stats().pool.prefix_cache_hits_tokens == out2.cached_tokens
