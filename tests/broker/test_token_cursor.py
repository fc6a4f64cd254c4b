"""TokenCursor and progress_of with logprobs and echo: a redelivered job's overlapping deltas show
each token's logprob once, in order; the prompt's echo rides only on the output's start."""

from __future__ import annotations

from broker import codec
from broker.jobs.events import EVENT_FIELD, TokenCursor, progress_of
from broker.messages import TokenDelta, TokenLogprob


def _lp(token: int) -> TokenLogprob:
    return TokenLogprob(token, f"t{token}", -0.1 * token)


def _delta(tokens: list[int], start: int, epoch: int, echo: bool = False) -> TokenDelta:
    text = "".join(f"t{t}" for t in tokens)
    prompt = (TokenLogprob(1, "p1"), TokenLogprob(2, "p2", -1.5)) if echo else ()
    return TokenDelta(
        text,
        tuple(tokens),
        start,
        sum(len(f"t{t}") for t in range(10, 10 + start)),
        epoch,
        tuple(_lp(t) for t in tokens),
        prompt,
        "p1p2" if echo else "",
    )


def test_overlapping_deltas_of_a_redelivered_job_show_each_logprob_once() -> None:
    # epoch 1 streamed tokens 10..13 then died; epoch 2 resumed and sent 12..15 again from index 2
    events = [_delta([10, 11], 0, 1, echo=True), _delta([12, 13], 2, 1), _delta([12, 13, 14, 15], 2, 2)]
    cursor = TokenCursor()
    shown = [e for e in (cursor.accept(e) for e in events) if e is not None]
    assert isinstance(shown[0], TokenDelta) and shown[0].prompt_text == "p1p2"
    assert [lp.token_id for lp in shown[0].prompt_logprobs] == [1, 2]
    tokens = [t for e in shown if isinstance(e, TokenDelta) for t in e.token_ids]
    logprobs = [lp.token_id for e in shown if isinstance(e, TokenDelta) for lp in e.logprobs]
    assert tokens == logprobs == [10, 11, 12, 13, 14, 15]
    assert all(not e.prompt_logprobs for e in shown[1:] if isinstance(e, TokenDelta))

    entries = [(str(i).encode(), {EVENT_FIELD: codec.encode_event(e)}) for i, e in enumerate(events)]
    progress = progress_of(entries)
    assert progress.token_ids == (10, 11, 12, 13, 14, 15)
    assert [lp.token_id for lp in progress.logprobs] == list(progress.token_ids)
    assert [lp.token_id for lp in progress.prompt_logprobs] == [1, 2]
