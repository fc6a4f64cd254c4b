"""Detokenizer: output text as tokens arrive, with stop-string detection."""

from __future__ import annotations

from typing import Any

from workers.engine.requests.sequence import EngineRequest


class Detokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def update(self, seq: EngineRequest, stop_token: bool = False) -> str | None:
        """Refresh seq.output_text (cut before a stop string); returns the stop string hit, if any.

        An incomplete UTF-8 character at the end (U+FFFD) is left out until it completes, but the
        text before it is not: a request resumed with such a token last (a redelivered job)
        would otherwise have no text yet, and stream the client's characters to it again.
        stop_token: seq ends with the EOS or stop token id that ended it, whose text is left out
        (vLLM's). Stop strings count only in the text after the first min_tokens tokens (vLLM's).
        """
        ids = seq.output_token_ids[:-1] if stop_token else seq.output_token_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")
        stop_hit = None
        if seq.params.stop and not stop_token and len(ids) > seq.params.min_tokens:
            longest = max(len(s) for s in seq.params.stop)
            search_from = max(0, len(seq.output_text) - longest + 1)
            best = -1
            for stop in seq.params.stop:
                at = text.find(stop, search_from)
                if at != -1 and (best == -1 or at < best):
                    best, stop_hit = at, stop
            if stop_hit is not None:
                text = text[:best]
        seq.output_text = text
        return stop_hit

    @staticmethod
    def stream_delta(seq: EngineRequest) -> str:
        """Text not yet streamed. While running, the tail that could start a stop string waits."""
        end = len(seq.output_text)
        if not seq.is_finished and seq.params.stop:
            end -= max(len(s) for s in seq.params.stop) - 1
        if end <= seq.num_streamed_chars:
            return ""
        delta = seq.output_text[seq.num_streamed_chars : end]
        seq.num_streamed_chars = end
        return delta
