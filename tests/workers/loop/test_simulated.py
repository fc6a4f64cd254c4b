"""The simulated engine (load tests only): refused unless asked for by name, deterministic, and a
resumed request continues exactly where its stream stopped."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from broker.sampling import SamplingParams
from ops.cli.main import main
from workers.engine.requests.request import GenerationRequest
from workers.loop.simulated import MODEL, SimulatedEngineRefusedError, SimulatedLoop, choose


def test_refused_unless_asked_for_by_both_names() -> None:
    assert choose("torch", "smollm2", 0.01, 16) is None  # a normal start never gets it
    assert choose("simulated", MODEL, 0.01, 16) is not None
    with pytest.raises(SimulatedEngineRefusedError, match="KVFERRY_ENGINE=simulated"):
        choose("torch", MODEL, 0.01, 16)
    with pytest.raises(SimulatedEngineRefusedError, match="--model simulated"):
        choose("simulated", "smollm2", 0.01, 16)


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--model", MODEL], "KVFERRY_ENGINE=simulated"), (["--engine", "simulated"], "--model simulated")],
)
def test_the_worker_command_refuses_half_a_request(args: list[str], says: str) -> None:
    result = CliRunner().invoke(main, ["worker", "--redis-url", "redis://127.0.0.1:1/0", *args], env={})
    assert result.exit_code != 0 and says in result.output, result.output


def _run(
    loop: SimulatedLoop, prompt: list[int], max_tokens: int, before: tuple[int, ...] = ()
) -> tuple[int, ...]:
    handle = loop.submit(
        GenerationRequest.new(prompt, SamplingParams(max_tokens=max_tokens), "r", output_token_ids=before)
    )
    outputs = list(handle)
    assert outputs[-1].finished and outputs[-1].finish_reason == "length"
    return outputs[-1].token_ids


def test_deterministic_and_resumes_exactly() -> None:
    loop = SimulatedLoop(token_delay_s=0.001)
    try:
        whole = _run(loop, [1, 2, 3], 8)
        assert len(whole) == 8 and whole == _run(loop, [1, 2, 3], 8)
        assert _run(loop, [1, 2, 3], 8, before=whole[:5]) == whole
        assert loop.tokenizer.decode(whole).isalpha()
        handle = loop.submit(GenerationRequest.new([4], SamplingParams(max_tokens=10_000), "long"))
        loop.abort("long")
        assert list(handle)[-1].finish_reason == "abort"
    finally:
        loop.stop()
    assert not loop.healthy
