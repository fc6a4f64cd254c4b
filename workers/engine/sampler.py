"""Sampler: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from broker.sampling import SamplingParams


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        if request_id not in self._generators:
            self._generators[request_id] = torch.Generator(device=self.device).manual_seed(seed)
        return self._generators[request_id]

    def sample(self, logits: torch.Tensor, requests: list[tuple[str, SamplingParams]]) -> list[int]:
        """logits: [N, vocab] fp32, one row per (request id, params)."""
        greedy = logits.argmax(dim=-1).tolist()
        out: list[int] = []
        for row, (request_id, params) in enumerate(requests):
            if params.greedy:
                out.append(int(greedy[row]))
                continue
            x = logits[row] / params.temperature
            if params.top_k > 0 and params.top_k < x.numel():
                kth = torch.topk(x, params.top_k).values[-1]
                x = x.masked_fill(x < kth, float("-inf"))
            if params.top_p < 1.0:
                sorted_x, order = torch.sort(x, descending=True)
                cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
                drop = cum - torch.softmax(sorted_x, dim=-1) > params.top_p  # keep the token that crosses p
                x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
            probs = torch.softmax(x, dim=-1)
            token = torch.multinomial(probs, 1, generator=self._generator(request_id, params.seed))
            out.append(int(token.item()))
        return out
