"""ChoiceStream: one choice's SSE chunks, from its job's events (each token once, in order)."""

from __future__ import annotations

from api.jobs.view import failed_body
from api.schema.answer import sse
from api.schema.openai import CompletionRequest
from api.tool_calls.answer import StreamedCalls, call_delta, finish_reason_of
from api.tool_calls.parser import ContentPiece, Piece
from broker.messages import JobDone, JobFailed, StreamEvent, TokenDelta, TokenLogprob


def echo_of(event: StreamEvent) -> tuple[str, tuple[TokenLogprob, ...]] | None:
    """The prompt's text and logprobs, on the delta that starts the output or in the result."""
    if isinstance(event, TokenDelta) and (event.prompt_text or event.prompt_logprobs):
        return event.prompt_text, event.prompt_logprobs
    if isinstance(event, JobDone):
        return event.result.prompt_text, event.result.prompt_logprobs
    return None


class ChoiceStream:
    """The chunks of one choice: a chat's role chunk first, completions' echo before the first
    text, each delta's text (with its tokens' logprobs when asked), the text the final result
    holds past what was streamed, and the finish; a failure as an error frame."""

    def __init__(self, request: CompletionRequest, writer: sse.ChunkWriter) -> None:
        self.request = request
        self.writer = writer
        self.sent: list[str] = []  # the text streamed so far
        self.echoed = not request.echo
        self.finished = False
        calling = request.tool_calling if request.is_chat else None
        self.calls = StreamedCalls(calling.tool_parser) if calling is not None else None

    def start(self) -> list[bytes]:
        return [self.writer.text("")] if self.request.is_chat else []  # the role chunk

    def chunks(self, event: StreamEvent, include_usage: bool) -> list[bytes]:
        out: list[bytes] = []
        if not self.echoed and (echo := echo_of(event)) is not None:
            self.echoed = True
            out.append(self.writer.echo(*echo))
        wants_logprobs = self.request.wants_logprobs
        if isinstance(event, TokenDelta) and (event.text or (wants_logprobs and event.logprobs)):
            self.sent.append(event.text)
            out.extend(self._text(event.text, event.logprobs))
        elif isinstance(event, JobDone):
            self.finished = True
            r = event.result
            streamed = "".join(self.sent)
            tail = r.text[len(streamed) :] if r.text.startswith(streamed) else ""
            if tail:
                out.extend(self._text(tail))
            finish_reason = r.finish_reason
            if self.calls is not None:
                out.extend(self._pieces(self.calls.finish(finish_reason)))
                finish_reason = finish_reason_of(self.calls.called, finish_reason)
            out.append(self.writer.text("", finish_reason, worker=r.worker))
            if include_usage:
                out.append(self.writer.usage(r.usage))
        elif isinstance(event, JobFailed):
            self.finished = True
            out.append(sse.error_frame(failed_body(event)))
        return out

    def _text(self, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> list[bytes]:
        if self.calls is None:
            return [self.writer.text(text, logprobs=logprobs)]
        out = self._pieces(self.calls.feed(text), logprobs)
        if not out and logprobs and self.request.wants_logprobs:
            out.append(self.writer.text("", logprobs=logprobs))  # held text: its logprobs go now
        return out

    def _pieces(self, pieces: list[Piece], logprobs: tuple[TokenLogprob, ...] = ()) -> list[bytes]:
        """Content as text chunks, calls as tool_calls chunks; the delta's logprobs on the first."""
        out = []
        for piece in pieces:
            if isinstance(piece, ContentPiece):
                out.append(self.writer.text(piece.text, logprobs=logprobs))
            else:
                out.append(self.writer.tool_calls([call_delta(piece)], logprobs=logprobs))
            logprobs = ()
        return out
