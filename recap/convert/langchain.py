"""LangChain messages (``langchain_core.messages``) and Recap's messages (OpenAI chat format).

``to_recap`` maps a ``HumanMessage``, ``AIMessage``, ``ToolMessage`` or ``SystemMessage`` to one
Recap message: tool calls as OpenAI ``tool_calls`` (arguments as a JSON string, the call id kept;
an invalid tool call, whose arguments did not parse, with its arguments as the model wrote them),
tool messages with their ``tool_call_id``, content blocks as OpenAI parts (LangChain's standard
``image``/``file`` blocks as ``image_url``/``file`` parts, data URLs for base64 data), reasoning
(``reasoning`` blocks, ``additional_kwargs["reasoning_content"]``) as ``reasoning_content`` and
Anthropic ``thinking`` blocks as ``thinking_blocks``. ``from_recap`` goes back: an assistant
message is an ``AIMessage`` with ``tool_calls`` (arguments parsed; a call whose arguments are no
JSON object one of its ``invalid_tool_calls``), its reasoning in
``additional_kwargs`` and its thinking blocks in its content.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import invalid_tool_call, tool_call

REASONING_KEY = "reasoning_content"
BLOCKS_KEY = "thinking_blocks"
THINKING_TYPES = ("thinking", "redacted_thinking")
ROLE_OF = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}


# --- content blocks ------------------------------------------------------------------------------


def _data_url(block: Mapping[str, Any], default_type: str) -> str:
    mime = str(block.get("mime_type") or default_type)
    return f"data:{mime};base64,{block.get('base64') or block.get('data') or ''}"


def block_to_part(block: Any) -> Any:
    """A LangChain content block as an OpenAI content part (text, image_url, file)."""
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if not isinstance(block, Mapping):
        return block
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": str(block.get("text") or "")}
    if kind == "image" and (block.get("url") or block.get("base64") or block.get("data")):
        url = block.get("url") or _data_url(block, "image/png")
        image: dict[str, Any] = {"url": url}
        detail = (block.get("extras") or {}).get("detail") if block.get("extras") else None
        if detail:
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}
    if kind == "file" and (block.get("base64") or block.get("url") or block.get("file_id")):
        file: dict[str, Any] = {}
        if block.get("base64"):
            file["file_data"] = _data_url(block, "application/pdf")
        elif block.get("url"):
            file["file_data"] = block["url"]
        if block.get("file_id") or block.get("id"):
            file["file_id"] = block.get("file_id") or block.get("id")
        name = (block.get("extras") or {}).get("filename") or block.get("filename")
        if name:
            file["filename"] = name
        return {"type": "file", "file": file}
    return dict(block)  # image_url, input_audio, file in OpenAI's own format, and the rest


def _content_to_recap(content: Any) -> tuple[Any, str | None, list[dict[str, Any]]]:
    """A message's content as (OpenAI content, reasoning text, thinking blocks)."""
    if content is None or isinstance(content, str):
        return content, None, []
    parts: list[Any] = []
    reasoning: list[str] = []
    thinking: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, Mapping) and block.get("type") == "reasoning":
            text = block.get("reasoning") or block.get("text") or ""
            if not text and block.get("summary"):
                text = "\n\n".join(str(s.get("text") or "") for s in block["summary"])
            if text:
                reasoning.append(str(text))
        elif isinstance(block, Mapping) and block.get("type") in THINKING_TYPES:
            thinking.append({k: v for k, v in block.items() if k != "index"})
        else:
            parts.append(block_to_part(block))
    if all(isinstance(p, Mapping) and p.get("type") == "text" for p in parts):
        text_content: Any = "".join(str(p["text"]) for p in parts)
        return text_content, "\n\n".join(reasoning) or None, thinking
    return parts, "\n\n".join(reasoning) or None, thinking


# --- LangChain to Recap --------------------------------------------------------------------------


def to_recap(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as a Recap message."""
    role = ROLE_OF.get(message.type)
    if role is None:
        raise ValueError(f"cannot store a LangChain message of type {message.type!r}")
    content, reasoning, thinking = _content_to_recap(message.content)
    out: dict[str, Any] = {"role": role, "content": content}
    if isinstance(message, AIMessage):
        calls = [
            {
                "id": str(call.get("id") or ""),
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call.get("args") or {})},
            }
            for call in message.tool_calls
        ]
        # a call whose arguments did not parse: sent to the provider as the model wrote it (as
        # langchain-openai sends it), and a tool message may answer it
        calls += [
            {
                "id": str(call["id"]),
                "type": "function",
                "function": {"name": call.get("name") or "", "arguments": call.get("args") or ""},
            }
            for call in message.invalid_tool_calls
            if call.get("id")
        ]
        if calls:
            out["tool_calls"] = calls
            if out["content"] == "":
                out["content"] = None
        reasoning = reasoning or message.additional_kwargs.get(REASONING_KEY)
        if reasoning:
            out[REASONING_KEY] = str(reasoning)
        if thinking:
            out[BLOCKS_KEY] = thinking
    if isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
        if message.name:
            out["name"] = message.name
        if out["content"] is None:
            out["content"] = ""
    return out


def to_recap_all(messages: Iterable[BaseMessage]) -> list[dict[str, Any]]:
    return [to_recap(message) for message in messages]


# --- Recap to LangChain --------------------------------------------------------------------------


def _arguments(text: str) -> dict[str, Any] | None:
    """A call's arguments as LangChain holds them; None when they are no JSON object (the call
    is then an invalid tool call, as LangChain makes one of a reply it cannot parse)."""
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def from_recap(message: Mapping[str, Any]) -> AnyMessage:
    """One Recap message (as ``assemble`` returns it) as a LangChain message."""
    role = message.get("role")
    content = message.get("content")
    if role == "assistant":
        blocks = [dict(b) for b in message.get(BLOCKS_KEY) or ()]
        body: Any = content if content is not None else ""
        if blocks:
            rest = [{"type": "text", "text": body}] if isinstance(body, str) and body else body
            body = blocks + (list(rest) if isinstance(rest, list) else [])
        calls: list[Any] = []
        invalid: list[Any] = []
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            name, text = str(function.get("name") or ""), str(function.get("arguments") or "")
            cid, args = str(call.get("id") or ""), _arguments(text)
            if args is None:
                invalid.append(invalid_tool_call(name=name, args=text, id=cid, error=None))
            else:
                calls.append(tool_call(name=name, args=args, id=cid))
        extra = {REASONING_KEY: message[REASONING_KEY]} if message.get(REASONING_KEY) else {}
        return AIMessage(
            content=body, tool_calls=calls, invalid_tool_calls=invalid, additional_kwargs=extra
        )
    if role == "tool":
        return ToolMessage(
            content=content if content is not None else "",
            tool_call_id=str(message.get("tool_call_id") or ""),
            name=message.get("name"),
        )
    if role in ("system", "developer"):
        return SystemMessage(content=content or "")
    return HumanMessage(content=content if content is not None else "")


def from_recap_all(messages: Sequence[Mapping[str, Any]]) -> list[AnyMessage]:
    return [from_recap(message) for message in messages]


def message_text(message: BaseMessage | None) -> str | None:
    """A (system) message's text, or None."""
    if message is None:
        return None
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text") or "") if isinstance(b, Mapping) else str(b) for b in content)
