"""max_prefill_tokens_with_decodes: a step that carries decodes takes at most that many prefill
tokens (decodes go first), and outputs stay token-exact with HF generate."""

from __future__ import annotations

import random

import pytest

from broker.sampling import SamplingParams
from ops.settings import Settings
from tests.workers._helpers import TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.request import GenerationRequest
from workers.engine.scheduling.scheduler import SchedulerOutput, is_decoding


def _record(engine: LLMEngine) -> list[SchedulerOutput]:
    steps: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        decoding = sum(1 for s in engine.scheduler.running if is_decoding(s))
        out = schedule()
        assert out.num_decodes == decoding, "a decode waited for a prompt"  # room to spare here
        # Decodes first: the scheduled list starts with exactly num_decodes decoding sequences.
        assert all(is_decoding(s.seq) for s in out.scheduled[: out.num_decodes]), out
        assert not any(is_decoding(s.seq) for s in out.scheduled[out.num_decodes :]), out
        steps.append(out)
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return steps


@pytest.mark.parametrize("cap", [8, 13])
def test_prefill_tokens_beside_decodes_are_capped_and_outputs_exact(tiny: TinyModel, cap: int) -> None:
    rng = random.Random(11)
    shorts = {f"s{i}": random_prompt(rng, 5 + i) for i in range(4)}
    longs = {"l0": random_prompt(rng, 90), "l1": random_prompt(rng, 41)}
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    engine = make_engine(
        tiny.loaded, num_blocks=48, max_num_batched_tokens=64, max_prefill_tokens_with_decodes=cap
    )
    steps = _record(engine)
    for rid, prompt in shorts.items():
        engine.add_request(GenerationRequest(rid, prompt, params))
    engine.step()  # the short prompts' prefill, alone: no decodes yet, so no cap
    assert steps[0].num_decodes == 0 and steps[0].num_prefill_tokens == sum(map(len, shorts.values()))

    outs = run_checked(engine, {rid: (p, params) for rid, p in longs.items()})

    for rid, prompt in {**shorts, **longs}.items():
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 24), f"{rid}, cap {cap}")
    beside = [s for s in steps if s.num_decodes and s.num_prefill_tokens]
    assert beside, "no step mixed decodes and prefill"
    assert max(s.num_prefill_tokens for s in beside) == cap, [s.num_prefill_tokens for s in beside]
    assert all(s.num_prefill_tokens <= cap for s in steps if s.num_decodes)


def test_without_a_cap_only_the_step_budget_applies(tiny: TinyModel) -> None:
    rng = random.Random(12)
    short, long = random_prompt(rng, 10), random_prompt(rng, 90)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    engine = make_engine(tiny.loaded, num_blocks=32, max_num_batched_tokens=33)
    steps = _record(engine)
    engine.add_request(GenerationRequest("short", short, params))
    engine.step()

    outs = run_checked(engine, {"long": (long, params)})

    assert_tokens(outs["long"].token_ids, tiny.expected(long, 12), "uncapped")
    assert max(s.num_prefill_tokens for s in steps if s.num_decodes) == 32  # budget 33 minus a decode


def test_the_cap_is_a_setting_and_validated() -> None:
    assert EngineConfig().max_prefill_tokens_with_decodes is None
    config = Settings.from_env({}, max_prefill_tokens_with_decodes=64).engine_config()
    assert config.max_prefill_tokens_with_decodes == 64
    with pytest.raises(ValueError, match="max_prefill_tokens_with_decodes"):
        EngineConfig(max_prefill_tokens_with_decodes=0)
