"""Postprocessor: a sampled token becomes request state and a RequestOutput (stop rules, text)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from broker.errors import InvalidRequestError
from kvstore.chain import BlockHash
from workers.engine.errors import RequestFailedError
from workers.engine.requests.detokenizer import Detokenizer
from workers.engine.requests.logprob import Logprob
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.sequence import EngineRequest, FinishReason


class Postprocessor:
    """Stop rules and detokenising; it never frees blocks (the engine finishes what ends here)."""

    def __init__(self, detokenizer: Detokenizer, eos_token_ids: Collection[int], max_model_len: int) -> None:
        self.detokenizer = detokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.generation_tokens = 0  # tokens appended so far, all requests

    def append(self, seq: EngineRequest, token: int) -> FinishReason | None:
        """Append one sampled token; why seq ends with it, if it does. Raises RequestFailedError
        when detokenising fails or its grammar refuses the token (that request alone fails)."""
        seq.output_token_ids.append(token)
        self.generation_tokens += 1
        complete = seq.grammar is not None and seq.grammar.accept(token)  # raises if it refuses it
        reason: FinishReason | None = None
        if self._stops(seq, token):
            reason, seq.stop_reason = "stop", token
        stop = self._detokenize(seq, stop_token=reason is not None)
        if reason is None and stop is not None:
            reason, seq.stop_reason = "stop", stop
        if reason is None and complete:  # the grammar allows nothing more
            reason = "stop"
        if reason is None and self._at_length(seq):
            reason = "length"
        return reason

    def resume(
        self, seq: EngineRequest, output_token_ids: Sequence[int], streamed_chars: int
    ) -> FinishReason | None:
        """Take output another process had made (and streamed_chars of its text already sent); why
        it is already complete (the next step would not have run), if it is."""
        restored = list(output_token_ids)
        min_tokens = seq.params.min_tokens
        if 0 < min_tokens < len(restored):  # stop strings count after min_tokens, as they did
            seq.output_token_ids = restored[:min_tokens]
            self._detokenize(seq)
        seq.output_token_ids = restored
        complete = seq.grammar is not None and seq.grammar.replay(output_token_ids)
        ended = bool(restored) and self._stops(seq, restored[-1])
        stop = self._detokenize(seq, stop_token=ended)
        seq.num_streamed_chars = min(streamed_chars, len(seq.output_text))
        if ended:
            seq.stop_reason = restored[-1]
            return "stop"
        if stop is not None:
            seq.stop_reason = stop
            return "stop"
        if complete:
            return "stop"
        return "length" if self._at_length(seq) else None

    def output(
        self,
        seq: EngineRequest,
        delta: list[int],
        delta_text: str | None = None,
        error: InvalidRequestError | None = None,
        block_hashes: tuple[BlockHash, ...] = (),
        delta_logprobs: tuple[Logprob, ...] = (),
    ) -> RequestOutput:
        text_start = seq.num_streamed_chars
        prompt_logprobs: tuple[Logprob, ...] = ()
        wanted = seq.params.prompt_logprobs is not None and not seq.prompt_logprobs_sent
        if wanted and (not seq.needs_prompt_logits or seq.is_finished):
            prompt_logprobs, seq.prompt_logprobs_sent = tuple(seq.prompt_logprobs), True
        return RequestOutput(
            request_id=seq.request_id,
            delta_token_ids=tuple(delta),
            delta_text=self.detokenizer.stream_delta(seq) if delta_text is None else delta_text,
            text_start=text_start,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            token_ids=tuple(seq.output_token_ids),
            text=seq.output_text,
            prompt_tokens=seq.num_prompt_tokens,
            # a resumed request also matches its earlier output: count prompt tokens only
            cached_tokens=min(
                seq.num_prompt_tokens,
                max(0, seq.num_cached_tokens) + seq.num_warm_tokens + seq.num_redis_tokens,
            ),
            pool_tokens=max(0, seq.num_cached_tokens),
            warm_tokens=seq.num_warm_tokens,
            redis_tokens=seq.num_redis_tokens,
            error=str(error) if error is not None else None,
            cause=error,
            block_hashes=block_hashes,
            delta_logprobs=delta_logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    def _stops(self, seq: EngineRequest, token: int) -> bool:
        """Whether token, seq's last, ends it: an EOS (unless ignore_eos) or one of its
        stop_token_ids, once more than min_tokens are out (the processors held them back before)."""
        p = seq.params
        if len(seq.output_token_ids) <= p.min_tokens:
            return False
        return token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)

    def _detokenize(self, seq: EngineRequest, stop_token: bool = False) -> str | None:
        try:
            return self.detokenizer.update(seq, stop_token)
        except Exception as exc:
            err = RequestFailedError.wrap(exc, "detokenize")
            if err is exc:
                raise
            raise err from exc

    def _at_length(self, seq: EngineRequest) -> bool:
        return len(seq.output_token_ids) >= seq.max_tokens or seq.num_tokens >= self.max_model_len
