"""The Responses API's stream: chat-completions chunks in, Responses stream events out, each
event's response object and output items built as ``responses_api`` builds a whole reply's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recap.workers.serve.chunks import chunk_usage, first_choice_deltas
from recap.workers.serve.errors import ServeError
from recap.workers.serve.responses_api import (
    FINISHED,
    Head,
    call_item,
    message_item,
    reasoning_item,
    text_part,
    usage_object,
)


@dataclass
class _Open:
    """An output item being streamed: its index, kind and what has arrived of it."""

    index: int
    kind: str  # "message", "reasoning" or "function_call"
    item: dict[str, Any]
    text: list[str] = field(default_factory=list)


class ResponseEvents:
    """Chat-completions chunks (as JSON objects) in, Responses stream events out: ``start``
    before the first chunk, ``feed`` for each, ``finish`` once the stream has ended."""

    def __init__(self, head: Head) -> None:
        self.head = head
        self.sequence = 0
        self.items: list[_Open] = []
        self.calls: dict[int, _Open] = {}  # chat tool-call index -> its item
        self.usage: tuple[int, int, int] | None = None
        self.finish_reason: str | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        response = self.head.response([], status="in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        self.usage = chunk_usage(chunk) or self.usage
        for finish, delta in first_choice_deltas(chunk):
            self.finish_reason = finish or self.finish_reason
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                events += self._text("reasoning", str(thought))
            if delta.get("content"):
                events += self._text("message", str(delta["content"]))
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
        return events

    def _current(self, kind: str) -> _Open | None:
        last = self.items[-1] if self.items else None
        return last if last is not None and last.kind == kind and "done" not in last.item else None

    def _text(self, kind: str, piece: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        current = self._current(kind)
        if current is None:
            events += self._close_texts()
            index = len(self.items)
            if kind == "message":
                item = message_item(self.head, index, "", status="in_progress")
            else:
                item = reasoning_item(self.head, index, "", status="in_progress")
            current = _Open(index, kind, item)
            self.items.append(current)
            events.append(self._event("response.output_item.added", output_index=index, item=item))
            if kind == "message":
                events.append(
                    self._event(
                        "response.content_part.added",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        part=text_part(""),
                    )
                )
        current.text.append(piece)
        name = "response.output_text.delta" if kind == "message" else "response.reasoning.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        events.append(
            self._event(
                name,
                item_id=current.item["id"],
                output_index=current.index,
                content_index=0,
                delta=piece,
                **extra,
            )
        )
        return events

    def _call(self, call: Mapping[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        position = call.get("index")
        position = position if isinstance(position, int) else len(self.calls)
        function = call.get("function") or {}
        current = self.calls.get(position)
        if current is None:
            events += self._close_texts()
            index = len(self.items)
            item = call_item(
                self.head,
                index,
                str(call.get("id") or f"call_{index}"),
                str(function.get("name") or ""),
                "",
                status="in_progress",
            )
            current = _Open(index, "function_call", item)
            self.items.append(current)
            self.calls[position] = current
            events.append(self._event("response.output_item.added", output_index=index, item=item))
        arguments = function.get("arguments")
        if arguments:
            current.text.append(str(arguments))
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=current.item["id"],
                    output_index=current.index,
                    delta=str(arguments),
                )
            )
        return events

    def _close_texts(self) -> list[dict[str, Any]]:
        """Close the open text or reasoning item (tool calls stay open until the end: a later
        chunk may still carry their arguments)."""
        last = self.items[-1] if self.items else None
        if last is None or last.kind == "function_call" or "done" in last.item:
            return []
        return self._close(last)

    def _close(self, current: _Open) -> list[dict[str, Any]]:
        current.item["done"] = True  # marks it closed; removed from what is sent
        text = "".join(current.text)
        index, item_id = current.index, current.item["id"]
        events: list[dict[str, Any]] = []
        if current.kind == "message":
            item = message_item(self.head, index, text)
            events.append(
                self._event(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            events.append(
                self._event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=text_part(text),
                )
            )
        elif current.kind == "reasoning":
            item = reasoning_item(self.head, index, text)
            events.append(
                self._event(
                    "response.reasoning.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                )
            )
        else:
            item = {**current.item, "arguments": text, "status": "completed"}
            item.pop("done", None)
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    name=item["name"],
                    arguments=text,
                )
            )
        current.item = {**item, "done": True}
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def finish(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for current in self.items:
            if "done" not in current.item:
                events += self._close(current)
        output = [{k: v for k, v in c.item.items() if k != "done"} for c in self.items]
        incomplete = FINISHED.get(self.finish_reason or "")
        response = self.head.response(
            output,
            status="incomplete" if incomplete else "completed",
            usage=usage_object(self.usage),
            incomplete=incomplete,
        )
        kind = "response.incomplete" if incomplete else "response.completed"
        events.append(self._event(kind, response=response))
        return events

    def failed(self, error: ServeError) -> list[dict[str, Any]]:
        """The events that end a stream the upstream broke off: the error, then the failed
        response."""
        output = [{k: v for k, v in c.item.items() if k != "done"} for c in self.items]
        code = error.code or "server_error"
        response = self.head.response(
            output, status="failed", error={"code": code, "message": error.message}
        )
        return [  # OpenAI's error event: the Open Responses schema nests these in an `error`
            # object, which the `openai` SDKs take for a failed request and raise on
            self._event("error", code=error.code, message=error.message, param=None),
            self._event("response.failed", response=response),
        ]


def sse(event: Mapping[str, Any]) -> bytes:
    """One server-sent event, named by its type as the Responses API names them."""
    payload = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {payload}\n\n".encode()
