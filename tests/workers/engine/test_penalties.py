"""The logits processors on fixed random logits, each equal to HF's own processor bit for bit
(frequency and presence penalties, which HF lacks, to the formula), batched over rows with
different settings beside rows with none."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from broker.sampling import SamplingParams
from workers.engine.requests.sequence import EngineRequest
from workers.engine.sampling import processors
from workers.engine.sampling.sampler import Sampler, min_p_filter

V = 300
EOS = (2, 11)


def _seq(
    rid: str, prompt: list[int], output: list[int], ignore_eos: bool = False, **fields: Any
) -> EngineRequest:
    params = SamplingParams(max_tokens=64, ignore_eos=ignore_eos, **fields)
    return EngineRequest(rid, prompt, params, 64, output_token_ids=list(output))


def _hf_reference(logits: torch.Tensor, seq: EngineRequest) -> torch.Tensor:
    """One row through HF's processors (vLLM's order), then the OpenAI penalty formula."""
    p = seq.params
    scores = logits[None, :].clone()
    ids = torch.tensor([seq.token_ids])
    if p.logit_bias:
        bias = SequenceBiasLogitsProcessor({(t,): float(b) for t, b in p.logit_bias})
        scores = bias(ids, scores)
    if p.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(float(p.repetition_penalty))(ids, scores)
    held = [*p.stop_token_ids, *(() if p.ignore_eos else EOS)]
    if p.min_tokens and held:
        scores = MinNewTokensLengthLogitsProcessor(seq.num_prompt_tokens, p.min_tokens, held)(ids, scores)
    counts = torch.zeros(V)
    for token, n in Counter(seq.output_token_ids).items():
        counts[token] = n
    freq = torch.tensor(p.frequency_penalty, dtype=torch.float32)
    presence = torch.tensor(p.presence_penalty, dtype=torch.float32)
    if p.frequency_penalty:
        scores = scores - freq * counts
    if p.presence_penalty:
        scores = scores - presence * (counts > 0)
    return scores[0]


def _rows() -> list[EngineRequest]:
    rng = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:  # with repeats, and EOS-free so that nothing ended early
        return [t if t not in EOS else t + 1 for t in torch.randint(0, 40, (n,), generator=rng).tolist()]

    return [
        _seq("plain", tokens(9), tokens(5)),
        _seq("repetition", tokens(12), tokens(8), repetition_penalty=1.7),
        _seq("repetition below 1", tokens(12), tokens(8), repetition_penalty=0.6),
        _seq("bias", tokens(5), tokens(3), logit_bias=((3, -100.0), (7, 2.5), (299, 0.25), (0, -1e-3))),
        _seq("min_tokens", tokens(5), tokens(2), min_tokens=4, stop_token_ids=(7, 9)),
        _seq("min_tokens, ignore_eos", tokens(5), tokens(2), True, min_tokens=4, stop_token_ids=(9,)),
        _seq("min_tokens reached", tokens(5), tokens(4), min_tokens=4, stop_token_ids=(7,)),
        _seq("frequency, presence", tokens(6), tokens(20), frequency_penalty=0.7, presence_penalty=-1.3),
        _seq("presence", tokens(6), tokens(20), presence_penalty=2.0),
        _seq("no output yet", tokens(6), [], frequency_penalty=2.0, repetition_penalty=1.2, min_tokens=1),
        _seq(
            "everything",
            tokens(10),
            tokens(12),
            logit_bias=((5, 3.0), (9, -2.0)),
            repetition_penalty=1.3,
            min_tokens=20,
            stop_token_ids=(5,),
            frequency_penalty=-0.4,
            presence_penalty=0.9,
        ),
        _seq("plain too", tokens(3), tokens(30)),
    ]


def _logits(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 4  # both signs


def test_each_row_equals_hfs_processors_in_one_batch() -> None:
    seqs = _rows()
    logits = _logits(len(seqs))
    before = logits.clone()

    out = processors.apply(logits, seqs, EOS)

    assert torch.equal(logits, before), "the input logits were modified"
    assert out is not logits
    for row, seq in enumerate(seqs):
        want = _hf_reference(logits[row], seq)
        assert torch.equal(out[row], want), f"{seq.request_id}: {(out[row] - want).abs().max()}"
        untouched = seq.request_id in ("plain", "min_tokens reached", "plain too")
        assert torch.equal(out[row], logits[row]) is untouched, seq.request_id


def test_every_row_wanting_a_processor_is_exact_too() -> None:
    seqs = [s for s in _rows() if s.request_id not in ("plain", "plain too", "min_tokens reached")]
    logits = _logits(len(seqs), seed=2)

    out = processors.apply(logits, seqs, EOS)

    for row, seq in enumerate(seqs):
        assert torch.equal(out[row], _hf_reference(logits[row], seq)), seq.request_id


def test_rows_that_want_nothing_cost_nothing() -> None:
    seqs = [
        _seq("a", [1, 2], [3]),
        _seq("b", [4], [5, 6], min_tokens=2),
        _seq("c", [4], [], True, min_tokens=3),
    ]
    logits = _logits(3)
    assert processors.apply(logits, seqs, EOS) is logits


def test_min_tokens_masks_until_enough_output_exists() -> None:
    seq = _seq("r", [1], [], min_tokens=2, stop_token_ids=(7,))
    logits = _logits(1)
    for n in range(4):
        out = processors.apply(logits, [seq], EOS)[0]
        masked = [t for t in (7, *EOS) if out[t] == float("-inf")]
        assert masked == ([7, *EOS] if n < 2 else []), n
        seq.output_token_ids.append(20)


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.4])
def test_min_p_equals_hfs_warper(min_p: float, temperature: float) -> None:
    x = _logits(5) / temperature
    x[1, :4] = x[1].max()  # ties with the top token stay
    assert torch.equal(min_p_filter(x, min_p), MinPLogitsWarper(min_p)(None, x))  # type: ignore[arg-type]


def test_greedy_takes_the_argmax_of_the_processed_logits() -> None:
    logits = _logits(3)
    low = int(logits[1].argmin())
    seqs = [
        _seq("plain", [1], [2]),
        _seq("biased", [1], [2], logit_bias=((low, 100.0),)),
        _seq("banned", [1], [2], logit_bias=((int(logits[2].argmax()), -100.0),)),
    ]

    out = Sampler(torch.device("cpu")).sample(logits, seqs)

    assert out[0] == int(logits[0].argmax())
    assert out[1] == low
    assert out[2] == int(logits[2].topk(2).indices[1])


def test_a_min_p_row_is_cut_beside_rows_drawn_together() -> None:
    """min_p 1 leaves the top token alone: that row is greedy whatever the draw, while its plain
    neighbours are still drawn together."""
    logits = _logits(4)
    plain = SamplingParams(max_tokens=8, temperature=1.0)
    seqs = [EngineRequest(f"r{i}", [1], plain, 8) for i in range(4)]
    seqs[2] = EngineRequest("min_p", [1], SamplingParams(max_tokens=8, temperature=1.0, min_p=1.0), 8)
    sampler = Sampler(torch.device("cpu"))
    for _ in range(20):
        assert sampler.sample(logits, seqs)[2] == int(logits[2].argmax())
