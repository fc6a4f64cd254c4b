"""A response's stream events, as OpenAI's, from its job's events: response.created and
.in_progress; for the message, output_item.added, content_part.added, output_text.delta per piece
of text, then .done events; for each call, output_item.added, function_call_arguments.delta and
.done, output_item.done; last response.completed (or .incomplete, or error and response.failed).
Each carries its sequence_number. The events are a function of the job's events alone, which the
job stream gives each once and in order (api/jobs/wait.follow), so a stream replayed from the
job's start numbers every event as the first one did: `starting_after` resumes it exactly."""

from __future__ import annotations

import json
from typing import Any

from api.responses import items as ids
from api.responses.items import text_part
from api.responses.record import ResponseRecord
from api.schema.answer import logprobs as logprobs_body
from api.tool_calls.answer import StreamedCalls
from api.tool_calls.parser import CallPiece, ContentPiece, Piece
from api.tool_calls.registry import parser_for
from broker.messages import TokenDelta, TokenLogprob

Event = dict[str, Any]


def sse(event: Event) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class ResponseEvents:
    def __init__(self, record: ResponseRecord) -> None:
        self.record = record
        self.seq = 0
        self.calls = StreamedCalls(parser_for(record.tool_parser)) if record.tool_parser else None
        self.sent: list[str] = []  # the answer's text streamed so far
        self.text: list[str] = []  # the message's content so far
        self.message_index: int | None = None  # the message's output_index, once opened
        self.call_index: dict[int, int] = {}  # call index -> output_index
        self.arguments: dict[int, str] = {}
        self.outputs = 0

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> list[Event]:
        # as it was when created, whenever it is replayed: nothing of its end
        ended = ("output", "usage", "incomplete_details", "error", "worker")
        body = {k: v for k, v in self.record.body.items() if k not in ended}
        body.update(
            status=self.record.first_status, output=[], usage=None, incomplete_details=None, error=None
        )
        created = self._event("response.created", response=body)
        if self.record.first_status == "queued":
            return [created, self._event("response.queued", response=body)]
        return [created, self._event("response.in_progress", response={**body, "status": "in_progress"})]

    def delta(self, event: TokenDelta) -> list[Event]:
        if not event.text:
            return []
        self.sent.append(event.text)
        logprobs = event.logprobs if self.record.logprobs else None
        return self._feed(event.text, logprobs)

    def _feed(self, text: str, logprobs: tuple[TokenLogprob, ...] | None) -> list[Event]:
        pieces: list[Piece] = self.calls.feed(text) if self.calls is not None else [ContentPiece(text)]
        return self._pieces(pieces, logprobs)

    def _pieces(self, pieces: list[Piece], logprobs: tuple[TokenLogprob, ...] | None = None) -> list[Event]:
        out: list[Event] = []
        rid = self.record.id
        for piece in pieces:
            if isinstance(piece, ContentPiece):
                if not piece.text:
                    continue
                out.extend(self._open_message())
                self.text.append(piece.text)
                lp = logprobs_body.chat_content(logprobs) if logprobs is not None else []
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=ids.message_id(rid),
                        output_index=self.message_index,
                        content_index=0,
                        delta=piece.text,
                        logprobs=lp,
                    )
                )
            elif isinstance(piece, CallPiece):
                if piece.index not in self.call_index:
                    self.call_index[piece.index] = self.outputs
                    self.outputs += 1
                    self.arguments[piece.index] = ""
                    item = ids.call_item(rid, piece.index, piece.name or "", "", "in_progress")
                    out.append(
                        self._event(
                            "response.output_item.added", output_index=self.call_index[piece.index], item=item
                        )
                    )
                if piece.arguments:
                    self.arguments[piece.index] += piece.arguments
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=ids.call_item_id(rid, piece.index),
                            output_index=self.call_index[piece.index],
                            delta=piece.arguments,
                        )
                    )
            logprobs = None  # a delta's logprobs go with its first piece
        return out

    def _open_message(self) -> list[Event]:
        if self.message_index is not None:
            return []
        self.message_index = self.outputs
        self.outputs += 1
        rid = self.record.id
        item = {**ids.message_item(rid, "", "in_progress", None), "content": []}
        part = text_part("", [] if self.record.logprobs else None)
        return [
            self._event("response.output_item.added", output_index=self.message_index, item=item),
            self._event(
                "response.content_part.added",
                item_id=ids.message_id(rid),
                output_index=self.message_index,
                content_index=0,
                part=part,
            ),
        ]

    def end(self, final: ResponseRecord, answer_text: str, finish_reason: str) -> list[Event]:
        """The closing events, from the record as its end left it (final.body's output)."""
        streamed = "".join(self.sent)
        tail = answer_text[len(streamed) :] if answer_text.startswith(streamed) else ""
        out = self._feed(tail, None) if tail else []
        if self.calls is not None:
            out.extend(self._pieces(self.calls.finish(finish_reason)))
        body = final.body
        for item in body["output"]:
            if item["type"] == "message":
                out.extend(self._open_message())
                out.extend(self._close_message(item))
            elif item["type"] == "function_call":
                out.extend(self._close_call(item))
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        out.append(self._event(kind, response=body))
        return out

    def _close_message(self, item: dict[str, Any]) -> list[Event]:
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": self.message_index}
        return [
            self._event(
                "response.output_text.done",
                **where,
                content_index=0,
                text=part["text"],
                logprobs=part.get("logprobs", []),
            ),
            self._event("response.content_part.done", **where, content_index=0, part=part),
            self._event("response.output_item.done", output_index=self.message_index, item=item),
        ]

    def _close_call(self, item: dict[str, Any]) -> list[Event]:
        index = int(item["id"].removeprefix(f"fc_{ids.item_key(self.record.id)}"))
        if index not in self.call_index:  # parsed whole at the end, never streamed
            self.call_index[index] = self.outputs
            self.outputs += 1
            added = {**item, "arguments": "", "status": "in_progress"}
            opened = [
                self._event("response.output_item.added", output_index=self.call_index[index], item=added)
            ]
        else:
            opened = []
        where = {"item_id": item["id"], "output_index": self.call_index[index]}
        return [
            *opened,
            self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
            self._event("response.output_item.done", output_index=self.call_index[index], item=item),
        ]

    def failed(self, final: ResponseRecord) -> list[Event]:
        error = final.body.get("error") or {}
        return [
            self._event("error", code=error.get("code"), message=error.get("message", ""), param=None),
            self._event("response.failed", response=final.body),
        ]
