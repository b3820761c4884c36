"""Pydantic AI messages (``pydantic_ai.messages``) and Recap's messages (OpenAI chat format).

A ``ModelRequest`` holds several parts; each becomes one Recap message: a ``SystemPromptPart`` a
system message, a ``UserPromptPart`` a user message (text, ``ImageUrl`` and image
``BinaryContent`` as ``image_url`` parts, other binary content as ``file`` parts with a data URL),
a ``ToolReturnPart`` a tool message with its call id and tool name, a ``RetryPromptPart`` the tool
message answering its call (or a user message when it answers none), a ``RetryFeedbackPart``
(Pydantic AI's own feedback on an output it could not use) a user message of the text the model
is shown. Where the OpenAI form loses something of a part (a ``RetryFeedbackPart``, which is not
the user's voice; a ``ToolReturnPart`` whose outcome is not ``success``) the message also keeps
the part as Pydantic AI serializes it (``PART_KEY``, not sent to a model and not counted), and
``from_recap`` rebuilds that part from it. A ``ModelResponse`` becomes
one assistant message: its text, its ``ToolCallPart``s as ``tool_calls`` (arguments as a JSON
string, the call id kept), its ``ThinkingPart``s as ``reasoning_content`` (or as Anthropic
``thinking_blocks`` when they carry a signature from Anthropic). ``from_recap`` goes back,
grouping consecutive non-assistant messages into one ``ModelRequest``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai import messages as pai_messages
from pydantic_ai.messages import (
    AudioUrl,
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
    VideoUrl,
)

REASONING_KEY = "reasoning_content"
BLOCKS_KEY = "thinking_blocks"
PART_KEY = "pydantic_ai_part"  # a request part as Pydantic AI serializes it (see above)
# Pydantic AI's own feedback on an unusable output (2.78 on; None before it)
RETRY_FEEDBACK: type[Any] | None = getattr(pai_messages, "RetryFeedbackPart", None)
_PARTS: TypeAdapter[Any] = TypeAdapter(ModelRequestPart)
ANTHROPIC = "anthropic"


# --- user content --------------------------------------------------------------------------------


def _data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def user_item_to_part(item: Any) -> dict[str, Any]:
    """One item of a ``UserPromptPart``'s content as an OpenAI content part."""
    if isinstance(item, str):
        return {"type": "text", "text": item}
    if isinstance(item, ImageUrl):
        return {"type": "image_url", "image_url": {"url": item.url}}
    if isinstance(item, BinaryContent):
        url = _data_url(item.data, item.media_type)
        if item.is_image:
            return {"type": "image_url", "image_url": {"url": url}}
        return {"type": "file", "file": {"file_data": url}}
    if isinstance(item, DocumentUrl | AudioUrl | VideoUrl):
        return {"type": "text", "text": f"[{item.kind}: {item.url}]"}
    return {"type": "text", "text": str(item)}


def part_to_user_item(part: Any) -> UserContent:
    """One OpenAI content part as an item of a ``UserPromptPart``."""
    if isinstance(part, str):
        return part
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind == "image_url":
        image = part.get("image_url") or {}
        url = str(image.get("url") if isinstance(image, Mapping) else image)
        if url.startswith("data:"):
            return BinaryContent.from_data_uri(url)
        return ImageUrl(url=url)
    if kind == "file":
        data = str((part.get("file") or {}).get("file_data") or "")
        if data.startswith("data:"):
            return BinaryContent.from_data_uri(data)
        return f"[file: {(part.get('file') or {}).get('filename') or data}]"
    if isinstance(part, Mapping):
        return str(part.get("text") or "")
    return str(part)


def _user_content(content: str | Sequence[UserContent]) -> Any:
    if isinstance(content, str):
        return content
    parts = [user_item_to_part(item) for item in content]
    if all(p["type"] == "text" for p in parts):
        return "".join(str(p["text"]) for p in parts)
    return parts


def _tool_content(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str)


# --- Pydantic AI to Recap ------------------------------------------------------------------------


def request_to_recap(request: ModelRequest) -> list[dict[str, Any]]:
    """A ``ModelRequest``'s parts as Recap messages, in order."""
    out: list[dict[str, Any]] = []
    for part in request.parts:
        if isinstance(part, SystemPromptPart):
            out.append({"role": "system", "content": part.content})
        elif isinstance(part, UserPromptPart):
            out.append({"role": "user", "content": _user_content(part.content)})
        elif isinstance(part, ToolReturnPart):
            message = {
                "role": "tool",
                "tool_call_id": part.tool_call_id,
                "name": part.tool_name,
                "content": _tool_content(part.content),
            }
            if getattr(part, "outcome", "success") != "success":  # a retried or failed call
                message[PART_KEY] = _PARTS.dump_python(part, mode="json")
            out.append(message)
        elif RETRY_FEEDBACK is not None and isinstance(part, RETRY_FEEDBACK):
            out.append(
                {
                    "role": "user",
                    "content": part.model_response(),
                    PART_KEY: _PARTS.dump_python(part, mode="json"),
                }
            )
        elif isinstance(part, RetryPromptPart):
            if part.tool_name is not None:
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": part.tool_call_id,
                        "name": part.tool_name,
                        "content": part.model_response(),
                    }
                )
            else:
                out.append({"role": "user", "content": part.model_response()})
    return out


def _arguments(part: ToolCallPart) -> str:
    """The call's arguments as the model wrote them (a string stays as it is)."""
    return part.args if isinstance(part.args, str) else part.args_as_json_str()


def response_to_recap(response: ModelResponse) -> dict[str, Any]:
    """A ``ModelResponse`` as one assistant message."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    blocks: list[dict[str, Any]] = []
    for part in response.parts:
        if isinstance(part, TextPart):
            texts.append(part.content)
        elif isinstance(part, ToolCallPart):
            calls.append(
                {
                    "id": part.tool_call_id,
                    "type": "function",
                    "function": {"name": part.tool_name, "arguments": _arguments(part)},
                }
            )
        elif isinstance(part, ThinkingPart):
            if part.signature and part.provider_name == ANTHROPIC:
                blocks.append(
                    {"type": "thinking", "thinking": part.content, "signature": part.signature}
                )
            elif part.content:
                reasoning.append(part.content)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message[REASONING_KEY] = "\n\n".join(reasoning)
    if blocks:
        message[BLOCKS_KEY] = blocks
    if message["content"] is None and not calls:
        message["content"] = ""
    return message


def to_recap(messages: Iterable[ModelMessage]) -> list[dict[str, Any]]:
    """Pydantic AI messages as Recap messages, in order."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            out.extend(request_to_recap(message))
        else:
            out.append(response_to_recap(message))
    return out


# --- Recap to Pydantic AI ------------------------------------------------------------------------


def _response_from(message: Mapping[str, Any]) -> ModelResponse:
    parts: list[ModelResponsePart] = []
    for block in message.get(BLOCKS_KEY) or ():
        parts.append(
            ThinkingPart(
                content=str(block.get("thinking") or ""),
                signature=block.get("signature"),
                provider_name=ANTHROPIC,
            )
        )
    if message.get(REASONING_KEY):
        parts.append(ThinkingPart(content=str(message[REASONING_KEY])))
    content = message.get("content")
    if content:
        text = (
            content
            if isinstance(content, str)
            else "".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping))
        )
        parts.append(TextPart(content=text))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append(
            ToolCallPart(
                tool_name=str(function.get("name") or ""),
                args=str(function.get("arguments") or "{}"),
                tool_call_id=str(call.get("id") or ""),
            )
        )
    return ModelResponse(parts=parts)


def _request_part(message: Mapping[str, Any], names: Mapping[str, str]) -> ModelRequestPart:
    kept = message.get(PART_KEY)
    if isinstance(kept, Mapping):
        try:  # the part as it was; another release's may not read back
            part: ModelRequestPart = _PARTS.validate_python(kept)
            return part
        except ValidationError:
            pass
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        call_id = str(message.get("tool_call_id") or "")
        text = content if isinstance(content, str) else json.dumps(content)
        return ToolReturnPart(
            tool_name=str(message.get("name") or names.get(call_id) or ""),
            content=text if text is not None else "",
            tool_call_id=call_id,
        )
    if role in ("system", "developer"):
        text = content if isinstance(content, str) else json.dumps(content)
        return SystemPromptPart(content=text or "")
    if content is None or isinstance(content, str):
        return UserPromptPart(content=content or "")
    return UserPromptPart(content=[part_to_user_item(part) for part in content])


def from_recap(messages: Sequence[Mapping[str, Any]]) -> list[ModelMessage]:
    """Recap messages (an assembly, say) as Pydantic AI messages: each assistant message a
    ``ModelResponse``, the messages between them one ``ModelRequest``."""
    out: list[ModelMessage] = []
    names: dict[str, str] = {}  # call id -> tool name, for results stored without one
    pending: list[ModelRequestPart] = []
    for message in messages:
        if message.get("role") == "assistant":
            if pending:
                out.append(ModelRequest(parts=pending))
                pending = []
            for call in message.get("tool_calls") or ():
                names[str(call.get("id"))] = str((call.get("function") or {}).get("name") or "")
            out.append(_response_from(message))
        else:
            pending.append(_request_part(message, names))
    if pending:
        out.append(ModelRequest(parts=pending))
    return out
