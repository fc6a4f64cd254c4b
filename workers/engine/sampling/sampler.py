"""Sampler: greedy, temperature, min-p, top-k, top-p, per-request seeds. One bad row fails alone."""

from __future__ import annotations

import logging
from collections.abc import Collection

import torch

from broker.errors import InvalidRequestError
from broker.sampling import SamplingParams
from workers.engine.requests.sequence import EngineRequest
from workers.engine.sampling import processors

Sampled = int | Exception  # a token id, or why this row could not be sampled
log = logging.getLogger(__name__)


class Sampler:
    def __init__(self, device: torch.device, eos_token_ids: Collection[int] = ()) -> None:
        self.device = device
        self.eos_token_ids = eos_token_ids  # min_tokens holds them back
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        if request_id not in self._generators:
            try:
                generator = torch.Generator(device=self.device).manual_seed(seed)
            except (ValueError, OverflowError, TypeError, RuntimeError) as exc:
                raise InvalidRequestError(f"seed {seed!r} is out of range: {exc}", "seed") from exc
            self._generators[request_id] = generator
        return self._generators[request_id]

    def sample(self, logits: torch.Tensor, seqs: list[EngineRequest]) -> list[Sampled]:
        """logits: [N, vocab] fp32, one row per request (never modified: the engine reads raw
        logprobs from it). The logits processors (processors.apply) run first.

        A row that raises (a seed torch refuses, a temperature so low that softmax gives NaN) comes
        back as its exception; the other rows are sampled exactly as if it were not there, each
        drawing from its own generator once."""
        # Each op here runs over every row's 49k entries, a cost each step pays on CPU: none is run
        # for nothing.
        logits = processors.apply(logits, seqs, self.eos_token_ids)
        requests = [(s.request_id, s.params) for s in seqs]
        greedy = logits.argmax(dim=-1).tolist() if any(p.greedy for _, p in requests) else []
        plain = [row for row, (_, params) in enumerate(requests) if _plain(params)]
        drawn = self._sample_plain(logits, [requests[row][1] for row in plain], plain)
        out: list[Sampled] = []
        for row, (request_id, params) in enumerate(requests):
            if params.greedy:
                out.append(int(greedy[row]))
                continue
            if row in drawn:
                out.append(drawn[row])
                continue
            try:
                out.append(self._sample_row(logits[row], request_id, params))
            except Exception as exc:
                out.append(exc)
        return out

    def _sample_plain(
        self, logits: torch.Tensor, params: list[SamplingParams], rows: list[int]
    ) -> dict[int, Sampled]:
        """Unseeded rows with a temperature alone, drawn together: one softmax and one inverse-CDF
        draw for the batch instead of a multinomial each."""
        if len(rows) < 2:
            return {}
        device = logits.device
        every_row = rows == list(range(logits.shape[0]))
        x = logits if every_row else logits.index_select(0, torch.tensor(rows, device=device))
        if any(p.temperature != 1.0 for p in params):
            temps = torch.tensor([p.temperature for p in params], device=device, dtype=logits.dtype)
            x = x / temps[:, None]
        probs = torch.softmax(x, dim=-1)
        finite = torch.isfinite(probs.sum(dim=-1)).tolist()  # a softmax row is in [0, 1] or has NaN
        ok = [i for i, f in enumerate(finite) if f]
        out: dict[int, Sampled] = {
            rows[i]: _overflow(params[i].temperature) for i, f in enumerate(finite) if not f
        }
        if ok:
            tokens = _inverse_cdf(probs if len(ok) == len(rows) else probs[ok]).tolist()
            out.update({rows[i]: int(t) for i, t in zip(ok, tokens, strict=True)})
        return out

    def sample_isolated(self, logits: torch.Tensor, seqs: list[EngineRequest]) -> list[Sampled]:
        """sample(), and if its batched part raises, row by row: only a row that raises again
        fails. No generator has been drawn from before the batched part, so this stays exact.
        Raises only when every row fails (then the batch, not a request, is broken)."""
        try:
            return self.sample(logits, seqs)
        except Exception:
            if len(seqs) == 1:
                raise
            log.warning("batched sampling raised; sampling %d rows one by one", len(seqs), exc_info=True)
            out: list[Sampled] = []
            for row, seq in enumerate(seqs):
                try:
                    out.extend(self.sample(logits[row : row + 1], [seq]))
                except Exception as exc:
                    out.append(exc)
            if all(isinstance(t, Exception) for t in out):
                raise
            return out

    def _sample_row(self, logits: torch.Tensor, request_id: str, params: SamplingParams) -> int:
        generator = self._generator(request_id, params.seed)  # first: a bad seed fails before any work
        x = logits / params.temperature
        if params.min_p > 0.0:  # after temperature, before top-k and top-p, as vLLM
            x = min_p_filter(x, params.min_p)
        if params.top_k > 0 and params.top_k < x.numel():
            kth = torch.topk(x, params.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=True)
            cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
            drop = cum - torch.softmax(sorted_x, dim=-1) > params.top_p  # keep the token that crosses p
            x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
        probs = torch.softmax(x, dim=-1)
        # On CUDA, multinomial over NaN is a device-side assert that kills the whole context, so
        # refuse the row here, on every device alike.
        if not bool(torch.isfinite(probs).all()):
            raise _overflow(params.temperature)
        token = torch.multinomial(probs, 1, generator=generator)
        return int(token.item())


def _plain(params: SamplingParams) -> bool:
    """Sampled with a temperature alone: no seed, no min-p, top-k or top-p cut."""
    return (
        not params.greedy
        and params.seed is None
        and params.top_k <= 0
        and params.top_p >= 1.0
        and params.min_p <= 0.0
    )


def min_p_filter(x: torch.Tensor, min_p: float) -> torch.Tensor:
    """x [..., vocab] (temperature applied) with the tokens whose probability is below min_p times
    the top token's at -inf (vLLM's min_p; the top token always stays)."""
    probs = torch.softmax(x, dim=-1)
    return x.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * min_p, float("-inf"))


def _inverse_cdf(probs: torch.Tensor) -> torch.Tensor:
    """One categorical draw per row [N, V] from one uniform each: the first index whose running
    sum passes u * total. torch.multinomial draws an exponential for every vocabulary entry (the
    exponential race), far more work on CPU than one running sum and a search; the sum stays fp32,
    as fp64 costs more (docs/benchmarks.md). In fp32 a token's share is off by at most half an ulp
    of the running sum (<= 3e-8): over 49k tokens <= ~1e-3 in total variation if every rounding went
    one way, ~1e-5 as they fall. FlashInfer's GPU samplers draw by inverse transform in fp32 the same way."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(probs.shape[0], 1, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1).flatten()


def _overflow(temperature: float) -> InvalidRequestError:
    return InvalidRequestError(f"temperature {temperature!r} makes the distribution overflow", "temperature")
