"""OpenAI Agents SDK items (Responses API input items, plain dicts) and Recap's messages.

``items_to_messages`` groups what one model response produced (its reasoning, its message, its
function calls) into one assistant message, as a chat-completions model returns it, and turns
each function call output into a tool message with the call's id. ``messages_to_items`` goes
back: an assistant message becomes its reasoning item, an assistant message item and one
``function_call`` item per call; a tool message becomes a ``function_call_output``.

Content parts map one to one: ``input_text``/``output_text`` and ``text``, ``input_image`` and
``image_url`` (the URL or data URL, and its ``detail``), ``input_file`` and ``file``,
``input_audio`` as it is. Reasoning is kept as ``reasoning_content`` (the summary texts and any
reasoning text, joined). Items of other types (hosted tool calls such as web or file search,
computer use, MCP) carry their own results: they are stored whole on an assistant message under
``openai_items`` and given back as they came.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REASONING_KEY = "reasoning_content"
OTHER_ITEMS_KEY = "openai_items"  # whole items of types without a chat-format equivalent
MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_TYPES = ("input_text", "output_text", "text")


# --- parts ---------------------------------------------------------------------------------------


def part_to_recap(part: Any) -> Any:
    """One Responses content part as a chat-format part."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind in TEXT_TYPES:
        return {"type": "text", "text": str(part.get("text") or "")}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal") or "")}
    if kind == "input_image":
        if part.get("image_url"):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            return {"type": "image_url", "image_url": image}
        return {"type": "file", "file": {"file_id": str(part.get("file_id") or "")}}
    if kind == "input_file":
        fields = {k: part[k] for k in ("file_data", "file_id", "filename") if part.get(k)}
        if part.get("file_url") and "file_data" not in fields:
            fields["file_data"] = part["file_url"]
        return {"type": "file", "file": fields}
    return dict(part)  # input_audio and anything else, as it came


def part_to_item(part: Any, *, role: str = "user") -> Any:
    """One chat-format part as a Responses content part (``output_text`` for an assistant)."""
    if isinstance(part, str):
        part = {"type": "text", "text": part}
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind == "text":
        text_type = "output_text" if role == "assistant" else "input_text"
        out: dict[str, Any] = {"type": text_type, "text": str(part.get("text") or "")}
        if role == "assistant":
            out["annotations"] = []
        return out
    if kind == "image_url":
        image = part.get("image_url") or {}
        url = image.get("url") if isinstance(image, Mapping) else image
        out = {"type": "input_image", "image_url": str(url or "")}
        out["detail"] = (image.get("detail") if isinstance(image, Mapping) else None) or "auto"
        return out
    if kind == "file":
        file = part.get("file") or {}
        return {"type": "input_file", **{k: v for k, v in file.items() if v}}
    return dict(part)


def content_to_recap(content: Any) -> Any:
    """A message's content: a string stays one; a list of parts is converted part by part (a
    list of text parts alone becomes their text, as a chat model would have sent it)."""
    if content is None or isinstance(content, str):
        return content
    parts = [part_to_recap(part) for part in content]
    if all(isinstance(p, Mapping) and p.get("type") == "text" for p in parts):
        return "".join(str(p["text"]) for p in parts)
    return parts


def content_to_item(content: Any, *, role: str = "user") -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return [part_to_item(part, role=role) for part in content]


# --- items to messages ---------------------------------------------------------------------------


def _reasoning_text(item: Mapping[str, Any]) -> str:
    texts = [str(s.get("text") or "") for s in item.get("summary") or () if isinstance(s, Mapping)]
    texts += [str(c.get("text") or "") for c in item.get("content") or () if isinstance(c, Mapping)]
    return "\n\n".join(t for t in texts if t)


def _output_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    converted = content_to_recap(content)
    if isinstance(converted, str):
        return converted
    return "".join(str(p.get("text") or "") for p in converted if isinstance(p, Mapping))


def _kind(item: Mapping[str, Any]) -> str:
    """``message``, ``function_call``, ``function_call_output``, ``reasoning`` or another type."""
    kind = item.get("type")
    if kind is None and item.get("role") in MESSAGE_ROLES:
        return "message"
    return str(kind)


def items_to_messages(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items, in order, as Recap messages (OpenAI chat format)."""
    messages: list[dict[str, Any]] = []
    group: dict[str, Any] | None = None  # the assistant message being built from one response
    names: dict[str, str] = {}  # call id -> tool name, for the results

    def close() -> None:
        nonlocal group
        if group is not None:
            messages.append(group)
        group = None

    def open_group() -> dict[str, Any]:
        nonlocal group
        if group is None:
            group = {"role": "assistant", "content": None}
        return group

    for item in items:
        kind = _kind(item)
        if kind == "message" and item.get("role") == "assistant":
            current = open_group()
            if current.get("content") or current.get("tool_calls"):
                close()  # a second message: a response of its own
                current = open_group()
            current["content"] = _output_text(item.get("content"))
        elif kind == "message":
            close()
            messages.append(
                {"role": str(item["role"]), "content": content_to_recap(item.get("content"))}
            )
        elif kind == "reasoning":
            current = open_group()
            if current.get("content") or current.get("tool_calls") or REASONING_KEY in current:
                close()  # reasoning starts the next response
                current = open_group()
            current[REASONING_KEY] = _reasoning_text(item)
        elif kind == "function_call":
            current = open_group()
            call_id = str(item.get("call_id") or item.get("id") or "")
            names[call_id] = str(item.get("name") or "")
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": names[call_id], "arguments": str(item.get("arguments", ""))},
            }
            current.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            close()
            call_id = str(item.get("call_id") or "")
            result: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": call_id,
                "content": _output_content(item.get("output")),
            }
            if names.get(call_id):
                result["name"] = names[call_id]
            messages.append(result)
        else:  # a hosted tool call, an MCP item, a reference: kept whole
            current = open_group()
            current.setdefault(OTHER_ITEMS_KEY, []).append(dict(item))
    close()
    return messages


def _output_content(output: Any) -> Any:
    if output is None or isinstance(output, str):
        return output or ""
    if isinstance(output, list):
        return content_to_recap(output)
    return json.dumps(output)


# --- messages to items ---------------------------------------------------------------------------


def message_to_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Recap message as the Responses items it stands for."""
    role = message.get("role")
    if role == "tool":
        content = message.get("content")
        output = (
            content if isinstance(content, str) or content is None else content_to_item(content)
        )
        return [
            {
                "type": "function_call_output",
                "call_id": str(message.get("tool_call_id") or ""),
                "output": output or "",
            }
        ]
    if role != "assistant":
        return [{"role": str(role), "content": content_to_item(message.get("content"))}]
    items: list[dict[str, Any]] = []
    if message.get(REASONING_KEY):
        summary = [{"type": "summary_text", "text": str(message[REASONING_KEY])}]
        items.append({"type": "reasoning", "summary": summary})
    content = message.get("content")
    if content:
        text = content if isinstance(content, str) else _output_text(content)
        items.append({"role": "assistant", "content": text})
    items.extend(dict(item) for item in message.get(OTHER_ITEMS_KEY) or ())
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "arguments": str(function.get("arguments") or ""),
            }
        )
    return items


def messages_to_items(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Recap messages (an assembly, say) as Responses input items, in order."""
    return [item for message in messages for item in message_to_items(message)]


def is_model_output(item: Mapping[str, Any]) -> bool:
    """Whether an item comes from a model response or a tool (not the user's input): a batch
    with one ends a turn."""
    kind = _kind(item)
    return not (kind == "message" and item.get("role") != "assistant")
