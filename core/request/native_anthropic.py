"""Anthropic's Messages API blocks (pure): Recap's chat messages as Anthropic messages, each
assistant message's provider items (signed and redacted thinking, server tool and compaction
blocks) back at their places (``anthropic_input``), and an Anthropic reply as the assistant
message Recap stores (``reply_message``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recap.core.request.native_items import (
    Report,
    placed,
    provider_item,
    summary_items,
    text_of,
)

PROVIDER = "anthropic"
THINKING = frozenset({"thinking", "redacted_thinking"})  # under the thinking window
SYSTEM_ROLES = ("system", "developer")
# Before a provider's compaction block that would open the request: Anthropic's messages start
# with a user turn, and everything before a compaction block is dropped by the API.
COMPACTED_NOTE = "[Earlier conversation, compacted.]"


def arguments_of(value: Any) -> str:
    """A tool's input as a chat-completions ``arguments`` string, always written one way."""
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def input_of(arguments: Any) -> Any:
    """A chat-completions ``arguments`` string as a tool_use ``input`` object."""
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def anthropic_input(
    messages: Sequence[Mapping[str, Any]],
    model: str,
    report: Report | None = None,
    wrap: Callable[[str], Any] = json.loads,
) -> tuple[str, list[dict[str, Any]]]:
    """The system text (the leading system messages) and the alternating messages for
    ``model``: tool results and any later system text as user blocks, a role repeated merged
    into one."""
    report = report if report is not None else Report()
    start, system = 0, []
    while start < len(messages) and messages[start].get("role") in SYSTEM_ROLES:
        system.append(text_of(messages[start].get("content")))
        start += 1
    out: list[dict[str, Any]] = []
    for message in messages[start:]:
        role = message.get("role")
        if role == "assistant":
            add(out, "assistant", placed(message, readable(message), model, report, wrap))
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": text_of(message.get("content")),
            }
            add(out, "user", [result])
        elif (raw := summary_items(message, model, report, wrap)) is not None:
            if not out:
                add(out, "user", [{"type": "text", "text": COMPACTED_NOTE}])
            add(out, "assistant", raw)  # the provider's compaction of the summary's span
        else:
            add(out, "user", user_blocks(message.get("content")))
    return "\n\n".join(t for t in system if t), out


def add(out: list[dict[str, Any]], role: str, blocks: list[Any]) -> None:
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"] = [*out[-1]["content"], *blocks]
    else:
        out.append({"role": role, "content": list(blocks)})


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
                provider_item(
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
