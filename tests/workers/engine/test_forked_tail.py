"""n choices of one prompt: the full blocks are shared, and the partial last block a running
choice computed is copied into each later one's own block (copy on write), so the prompt is
computed once: every later choice computes its last token alone. Outputs stay token-exact."""

from __future__ import annotations

import random

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.requests.request import GenerationRequest

GREEDY = SamplingParams(max_tokens=6, **NO_EOS)


def test_choices_admitted_together_compute_the_prompt_once(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(11), 40)  # 2 full blocks and 8 tokens
    engine = make_engine(tiny.loaded, num_blocks=32)

    outs = run_checked(engine, {f"c{i}": (prompt, GREEDY) for i in range(4)})

    for out in outs.values():
        assert_tokens(out.token_ids, tiny.expected(prompt, 6), "a forked choice")
    assert engine.stats().prompt_tokens_computed == 40 + 3, "each later choice computes its last token"


def test_a_choice_admitted_later_copies_a_block_its_donor_wrote_on_into(tiny: TinyModel) -> None:
    """The donor's partial block holds its output by then: only the prompt's part is taken, the
    rest is the later choice's to overwrite."""
    prompt = random_prompt(random.Random(12), 37)
    engine = make_engine(tiny.loaded, num_blocks=32)
    engine.add_request(GenerationRequest("first", prompt, SamplingParams(max_tokens=10, **NO_EOS)))
    for _ in range(4):
        engine.step()
        engine.check_integrity()
    before = engine.stats().prompt_tokens_computed

    outs = run_checked(engine, {"later": (prompt, GREEDY)})

    assert_tokens(outs["later"].token_ids, tiny.expected(prompt, 6), "the later choice")
    assert engine.stats().prompt_tokens_computed - before == 1
    sampled = SamplingParams(max_tokens=5, temperature=1.0, seed=3, **NO_EOS)
    fresh = make_engine(tiny.loaded, num_blocks=32)
    alone = run_checked(fresh, {"alone": (prompt, sampled)})["alone"]
    engine.add_request(GenerationRequest("seeded", prompt, sampled))
    engine.add_request(GenerationRequest("other", random_prompt(random.Random(13), 20), GREEDY))
    got = run_checked(engine)
    assert got["seeded"].token_ids == alone.token_ids, "a copied block gives the draws a computed one does"


def test_another_prompt_or_salt_takes_nothing(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(14), 40)
    other = prompt[:36] + random_prompt(random.Random(15), 4)  # the same full blocks, 4 tokens differ
    engine = make_engine(tiny.loaded, num_blocks=32)
    engine.add_request(GenerationRequest("a", prompt, GREEDY))
    engine.add_request(GenerationRequest("b", other, GREEDY))
    engine.add_request(GenerationRequest("c", prompt, GREEDY, cache_salt="tenant-2"))

    outs = run_checked(engine)

    assert_tokens(outs["b"].token_ids, tiny.expected(other, 6), "a prompt that differs in its last block")
    assert_tokens(outs["c"].token_ids, tiny.expected(prompt, 6), "another salt")
    # b: its 4 shared tokens of the last block come by copy, the 4 that differ are computed
    assert engine.stats().prompt_tokens_computed == 40 + 4 + 40
