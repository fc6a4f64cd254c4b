"""ChoiceStream: one choice's SSE chunks, from its job's events (each token once, in order)."""

from __future__ import annotations

from api.jobs.view import failed_body
from api.schema import sse
from api.schema.openai import CompletionRequest
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
            out.append(self.writer.text(event.text, logprobs=event.logprobs))
        elif isinstance(event, JobDone):
            self.finished = True
            r = event.result
            streamed = "".join(self.sent)
            tail = r.text[len(streamed) :] if r.text.startswith(streamed) else ""
            if tail:
                out.append(self.writer.text(tail))
            out.append(self.writer.text("", r.finish_reason, worker=r.worker))
            if include_usage:
                out.append(self.writer.usage(r.usage))
        elif isinstance(event, JobFailed):
            self.finished = True
            out.append(sse.error_frame(failed_body(event)))
        return out
