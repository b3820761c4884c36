"""The Messages dialect sent natively (``workers.serve.native``): Recap's assembled chat
messages as an Anthropic Messages request, each assistant message's provider items (signed and
redacted thinking, server tool blocks, compaction blocks) back at their places; an Anthropic
reply as the assistant message Recap stores; its stream events made from the whole reply."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from recap.workers.serve import native
from recap.workers.serve.messages_api import arguments_of, input_of

PROVIDER = "anthropic"
OWN_FIELDS = frozenset({"model", "messages", "stream", "metadata"})
THINKING = frozenset({"thinking", "redacted_thinking"})  # under the thinking window
SYSTEM_ROLES = ("system", "developer")


class MessagesTurn:
    """One Messages turn sent natively: the client's body (its system blocks, tools, thinking,
    ``context_management`` and every other field pass on as given) and the model's string."""

    dialect = native.MESSAGES

    def __init__(self, body: Mapping[str, Any], model: str) -> None:
        self.body = body
        self.model = model
        self.report = native.Report()

    def request(self, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> bytes:
        """The upstream request for Recap's assembled ``messages``."""
        self.report = native.Report()
        body: dict[str, Any] = {k: v for k, v in self.body.items() if k not in OWN_FIELDS}
        body["model"] = native.upstream_name(self.model)
        system, turns = self.turns(messages)
        if system and "system" not in self.body:
            body["system"] = system
        body["messages"] = turns
        if isinstance(params.get("max_tokens"), int):  # the client's limit, cut to the room
            body["max_tokens"] = params["max_tokens"]
        return native.encode(body)

    def turns(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
        """The system text (the leading system messages) and the alternating messages: tool
        results and any later system text as user blocks, a role repeated merged into one."""
        start, system = 0, []
        while start < len(messages) and messages[start].get("role") in SYSTEM_ROLES:
            system.append(text_of(messages[start].get("content")))
            start += 1
        out: list[dict[str, Any]] = []
        for message in messages[start:]:
            role = message.get("role")
            if role == "assistant":
                blocks = native.placed(message, readable(message), self.model, self.report)
                add(out, "assistant", blocks)
            elif role == "tool":
                result = {
                    "type": "tool_result",
                    "tool_use_id": message.get("tool_call_id"),
                    "content": text_of(message.get("content")),
                }
                add(out, "user", [result])
            else:
                add(out, "user", user_blocks(message.get("content")))
        return "\n\n".join(t for t in system if t), out

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


def add(out: list[dict[str, Any]], role: str, blocks: list[Any]) -> None:
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"] = [*out[-1]["content"], *blocks]
    else:
        out.append({"role": role, "content": list(blocks)})


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content or ():
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = str(image.get("url") if isinstance(image, Mapping) else image)
            if url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                source = {"type": "base64", "media_type": media, "data": data}
            else:
                source = {"type": "url", "url": url}
            blocks.append({"type": "image", "source": source})
    return blocks


def readable(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's readable blocks in a reply's order: its text, its tool uses."""
    blocks: list[dict[str, Any]] = [
        dict(b) for b in message.get("thinking_blocks") or () if isinstance(b, Mapping)
    ]  # a client's own signed blocks (not a stored reply's: those are provider items)
    text = text_of(message.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": input_of(function.get("arguments")),
            }
        )
    return blocks


def reply_message(data: Mapping[str, Any], model: str) -> dict[str, Any]:
    """An Anthropic reply as one assistant message: its text, its tool uses as calls (their
    input written as the client sends it back), its thinking text as ``reasoning_content``
    (readable, never sent back), every other block a provider item at its place."""
    content = data.get("content")
    blocks = content if isinstance(content, list) else []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    kept: list[dict[str, Any]] = []
    for at, block in enumerate(blocks):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            function = {
                "name": str(block.get("name") or ""),
                "arguments": arguments_of(block.get("input")),
            }
            calls.append(
                {"id": str(block.get("id") or ""), "type": "function", "function": function}
            )
        else:
            thought = str(block.get("thinking") or "") if kind == "thinking" else ""
            if thought:
                thoughts.append(thought)
            summary = (
                str(block.get("summary") or block.get("content") or "")
                if kind == "compaction"
                else thought
            )
            reasoning_kind = "reasoning" if kind in THINKING else "other"
            kept.append(
                native.provider_item(
                    PROVIDER,
                    model,
                    block,
                    at,
                    kind=reasoning_kind,
                    readable=summary if isinstance(summary, str) else "",
                )
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if message["content"] is None and not calls:
        message["content"] = ""
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    if kept:
        message["provider_items"] = kept
    return message


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
