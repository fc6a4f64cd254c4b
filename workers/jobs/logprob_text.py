"""Engine logprobs (token ids) to the broker's TokenLogprob (with each token's text), on the job's
task thread rather than the engine's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.messages import TokenLogprob, TopLogprob
from workers.engine.requests.logprob import Logprob

# OpenAI's figure for a token the model gives no chance: JSON has no -Infinity.
FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if value > FLOOR else FLOOR


class LogprobText:
    """Token texts as the tokenizer decodes each token alone (an incomplete UTF-8 piece shows as
    U+FFFD, as in vLLM), memoised per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def entry(self, lp: Logprob) -> TokenLogprob:
        top = tuple(TopLogprob(t, self.text(t), _finite(v)) for t, v in lp.top)
        value = None if lp.logprob is None else _finite(lp.logprob)
        return TokenLogprob(lp.token_id, self.text(lp.token_id), value, top)

    def entries(self, lps: Sequence[Logprob]) -> tuple[TokenLogprob, ...]:
        return tuple(self.entry(lp) for lp in lps)

    def prompt(self, prompt_ids: Sequence[int], lps: Sequence[Logprob]) -> tuple[TokenLogprob, ...]:
        """The prompt's first token (nothing predicts it: no logprob), then the computed ones."""
        if not prompt_ids:
            return ()
        return (TokenLogprob(prompt_ids[0], self.text(prompt_ids[0])), *self.entries(lps))
