"""The Messages dialect sent natively (``workers.serve.native``): Recap's assembled chat
messages as an Anthropic Messages request, each assistant message's provider items (signed and
redacted thinking, server tool blocks, compaction blocks) back at their places; an Anthropic
reply as the assistant message Recap stores; its stream events made from the whole reply."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from recap.core.request.native_anthropic import anthropic_input, reply_message
from recap.workers.serve import native

OWN_FIELDS = frozenset({"model", "messages", "stream", "metadata"})


class MessagesTurn(native.NativeTurn):
    """One Messages turn sent natively: the client's body (its system blocks, tools, thinking,
    ``context_management`` and every other field pass on as given) and the model's string."""

    dialect = native.MESSAGES

    own_fields = OWN_FIELDS

    def request(self, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> bytes:
        """The upstream request for Recap's assembled ``messages``."""
        body = self.base_request()
        system, turns = anthropic_input(messages, self.model, self.report, native.RawItem)
        if system and "system" not in self.body:
            body["system"] = system
        body["messages"] = turns
        if isinstance(params.get("max_tokens"), int):  # the client's limit, cut to the room
            body["max_tokens"] = params["max_tokens"]
        return native.encode(body)

    def reply_message(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return reply_message(data, self.model)

    def usage(self, data: Mapping[str, Any]) -> tuple[int, int, int] | None:
        usage = data.get("usage")
        if not isinstance(usage, Mapping):
            return None
        read = usage.get("cache_read_input_tokens") or 0
        written = usage.get("cache_creation_input_tokens") or 0
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        return prompt + int(read) + int(written), completion, int(read)

    def answer(self, data: Mapping[str, Any], _response_id: str, _store: bool) -> dict[str, Any]:
        return dict(data)

    def events(self, answer: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        yield from message_events(answer)


def message_events(answer: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """A whole message as its stream: message_start, each block started, its content as one
    delta (text, thinking and its signature, a tool's input), stopped; message_delta and
    message_stop."""
    found = answer.get("usage")
    usage: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    start = {**answer, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 0}
    yield {"type": "message_start", "message": start}
    for index, block in enumerate(answer.get("content") or ()):
        kind = block.get("type")
        if kind == "text":
            yield _start(index, {**block, "text": ""})
            yield _delta(index, {"type": "text_delta", "text": block.get("text", "")})
        elif kind == "thinking":
            yield _start(index, {**block, "thinking": "", "signature": ""})
            yield _delta(index, {"type": "thinking_delta", "thinking": block.get("thinking", "")})
            yield _delta(
                index, {"type": "signature_delta", "signature": block.get("signature", "")}
            )
        elif kind == "tool_use":
            yield _start(index, {**block, "input": {}})
            partial = json.dumps(block.get("input") or {}, ensure_ascii=False)
            yield _delta(index, {"type": "input_json_delta", "partial_json": partial})
        else:
            yield _start(index, dict(block))
        yield {"type": "content_block_stop", "index": index}
    delta = {"stop_reason": answer.get("stop_reason"), "stop_sequence": answer.get("stop_sequence")}
    yield {
        "type": "message_delta",
        "delta": delta,
        "usage": {"output_tokens": usage.get("output_tokens", 0)},
    }
    yield {"type": "message_stop"}


def _start(index: int, block: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}
