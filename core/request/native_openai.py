"""The OpenAI Responses API's items (pure): Recap's chat messages as Responses input items, each
assistant message's provider items back at their places (``responses_input``), and a Responses
reply as the assistant message Recap stores (``reply_message``: its text and function calls
readable, its reasoning summary as ``reasoning_content``, every other item a provider item).
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

PROVIDER = "openai"
SYSTEM_ROLES = ("system", "developer")


def responses_input(
    messages: Sequence[Mapping[str, Any]],
    model: str,
    report: Report | None = None,
    wrap: Callable[[str], Any] = json.loads,
) -> tuple[str, list[Any]]:
    """The instructions (the leading system messages) and the input items for ``model``."""
    report = report if report is not None else Report()
    start, system = 0, []
    while start < len(messages) and messages[start].get("role") in SYSTEM_ROLES:
        system.append(text_of(messages[start].get("content")))
        start += 1
    items: list[Any] = []
    for message in messages[start:]:
        role = message.get("role")
        if role == "assistant":
            items += placed(message, readable(message), model, report, wrap)
        elif role == "tool":
            output = text_of(message.get("content"))
            call_id = message.get("tool_call_id")
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        elif (raw := summary_items(message, model, report, wrap)) is not None:
            items += raw  # the provider's compaction of the span the summary covers
        else:
            items.append({"role": role, "content": input_content(message.get("content"))})
    return "\n\n".join(t for t in system if t), items


def input_content(content: Any) -> Any:
    """A user (or system) message's content as Responses input content."""
    if not isinstance(content, list):
        return content if isinstance(content, str) else ""
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append({"type": "input_text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, Mapping) else image
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
        elif kind == "file":
            file = part.get("file") or {}
            parts.append({"type": "input_file", **{k: v for k, v in file.items() if v}})
    return parts


def readable(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's readable items in the order a reply gives them: its text, then
    its function calls."""
    items: list[dict[str, Any]] = []
    text = text_of(message.get("content"))
    if text:
        items.append({"role": "assistant", "content": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
            }
        )
    return items


def reply_message(data: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A Responses reply's output as one assistant message: its text, its function calls,
    its reasoning summary as ``reasoning_content`` (readable, never sent back), every other
    item a provider item at its place, reasoning items with the provider's reasoning tokens
    shared among them."""
    output = data.get("output")
    output = output if isinstance(output, list) else []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    kept: list[dict[str, Any]] = []
    reasoning_items = [i for i in output if isinstance(i, Mapping) and i.get("type") == "reasoning"]
    shares = reasoning_shares(data.get("usage"), len(reasoning_items))
    for at, item in enumerate(output):
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "message":
            texts += message_texts(item)
        elif kind == "function_call":
            calls.append(chat_call(item))
        elif kind == "reasoning":
            summary = summary_text(item)
            thoughts.append(summary)
            if item.get("encrypted_content"):
                share = shares.pop(0) if shares else None
                kept.append(
                    provider_item(
                        PROVIDER, model, item, at, kind="reasoning", readable=summary, tokens=share
                    )
                )
        else:  # compaction, built-in tool calls and their results: opaque to Recap
            kept.append(provider_item(PROVIDER, model, item, at, kind="other"))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if message["content"] is None and not calls:
        message["content"] = ""
    thought = "\n".join(t for t in thoughts if t)
    if thought:
        message["reasoning_content"] = thought
    if kept:
        message["provider_items"] = kept
    return message


def message_texts(item: Mapping[str, Any]) -> list[str]:
    """The texts (and refusals) of an output message."""
    out = []
    for part in item.get("content") or ():
        if isinstance(part, Mapping) and part.get("type") == "output_text":
            out.append(str(part.get("text", "")))
        elif isinstance(part, Mapping) and part.get("type") == "refusal":
            out.append(str(part.get("refusal", "")))
    return out


def chat_call(item: Mapping[str, Any]) -> dict[str, Any]:
    """A ``function_call`` item as a chat-completions tool call."""
    function = {"name": str(item.get("name") or ""), "arguments": str(item.get("arguments") or "")}
    return {"id": str(item.get("call_id") or ""), "type": "function", "function": function}


def summary_text(item: Mapping[str, Any]) -> str:
    parts = [*(item.get("summary") or ()), *(item.get("content") or ())]
    return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping))


def reasoning_shares(usage: Any, count: int) -> list[int]:
    """The provider's reasoning tokens shared among ``count`` reasoning items (none when the
    usage does not give them)."""
    details = usage.get("output_tokens_details") if isinstance(usage, Mapping) else None
    total = details.get("reasoning_tokens") if isinstance(details, Mapping) else None
    if not isinstance(total, int) or total <= 0 or count == 0:
        return []
    return [total // count + (1 if n < total % count else 0) for n in range(count)]
