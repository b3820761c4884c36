"""The OpenAI Responses API over chat completions (pure): a ``POST /v1/responses`` body as a
chat-completions request, and a chat-completions reply (whole, or chunk by chunk) as a Responses
object and its stream of semantic events.

A response id Recap returns names the conversation and the stored message the next turn
continues after (``previous_response_id``): ``resp_`` and the URL-safe base64 of
``r<reply id>:<conversation>`` (the stored reply) or ``a<request leaf>:<conversation>`` (the
reply stored after that message, for a stream, whose id is given before its reply is stored).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recap.workers.serve import response_objects
from recap.workers.serve.errors import bad_request
from recap.workers.serve.validation import responses as rules
from recap.workers.serve.validation.responses import item_type

RESPONSE_PREFIX = "resp_"
REFERENCE = re.compile(r"([ra])(\d{1,19}):(.+)", re.DOTALL)
CONVERSATION_PREFIX = "resp-"  # a conversation a Responses client started without naming one
DERIVED_ID_CHARS = 24  # 96 bits of the owner and first message: distinct chats never collide
# Read here and not passed on as chat-completions parameters.
OWN_FIELDS = frozenset(
    {"model", "input", "instructions", "stream", "store", "previous_response_id", "metadata"}
)
# Accepted and without effect: Recap fits the window itself and returns what it has.
IGNORED_FIELDS = frozenset(
    {
        "truncation",
        "include",
        "stream_options",
        "safety_identifier",
    }
)
RENAMED = {"max_output_tokens": "max_tokens"}
PASSED = frozenset(
    {
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "parallel_tool_calls",
        "user",
        "service_tier",
        "top_logprobs",
        "prompt_cache_key",  # a client's own caching hints (workers.serve.upstream.CACHE_PARAMS)
        "prompt_cache_retention",
    }
)
FINISHED = {"length": "max_output_tokens", "content_filter": "content_filter"}


@dataclass(frozen=True, slots=True)
class Reference:
    """What a response id names: the conversation, a stored message, and whether it is the
    reply itself (``exact``) or the message the reply was stored after."""

    conversation_id: str
    message_id: int
    exact: bool


def response_id(conversation_id: str, message_id: int, *, exact: bool) -> str:
    """The id of a stored response (see the module's docstring)."""
    raw = f"{'r' if exact else 'a'}{message_id}:{conversation_id}".encode()
    return RESPONSE_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unstored_id() -> str:
    """The id of a response nothing was kept of (``store: false``): it names nothing."""
    return f"{RESPONSE_PREFIX}0{uuid.uuid4().hex}"


def parse_response_id(value: str) -> Reference | None:
    """The reference a response id holds, or None for an id Recap did not give."""
    if not value.startswith(RESPONSE_PREFIX):
        return None
    encoded = value[len(RESPONSE_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    found = REFERENCE.fullmatch(raw)
    if found is None:
        return None
    return Reference(found.group(3), int(found.group(2)), found.group(1) == "r")


def derived_conversation(owner: str, first: Mapping[str, Any]) -> str:
    """The conversation of a Responses client that names none: one per key and first message,
    so a client resending its whole input every turn stays in one conversation."""
    digest = hashlib.sha256(
        (owner + "\n" + json.dumps(first, sort_keys=True, default=str)).encode()
    ).hexdigest()
    return CONVERSATION_PREFIX + digest[:DERIVED_ID_CHARS]


@dataclass(kw_only=True)
class ChatRequest:
    """A Responses request as chat completions: the system part (``instructions``), the
    messages, the parameters to pass on, and what only Recap reads."""

    model: str
    system: str | None
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    stream: bool
    store: bool
    previous_response_id: str | None
    echo: dict[str, Any] = field(default_factory=dict)  # given fields the response repeats

    def with_system(self) -> list[dict[str, Any]]:
        """The messages with the system part first."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *self.messages]


def chat_request(body: Mapping[str, Any]) -> ChatRequest:
    """The chat-completions request for a Responses body; an OpenAI-format 400 for what it
    cannot carry."""
    known = OWN_FIELDS | IGNORED_FIELDS | PASSED | set(RENAMED) | {
        "tools", "tool_choice", "text", "reasoning", "background", "user",
    }  # fmt: skip
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad_request(
            f"Unrecognized request argument supplied: {', '.join(unknown)}", param=unknown[0]
        )
    rules.check_body(body)  # every field and input item, before anything is read
    stream, store = body.get("stream") is True, body.get("store") is not False
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` must be a non-empty string.", param="model")
    if not isinstance(stream, bool) or not isinstance(store, bool):
        raise bad_request("`stream` and `store` must be true or false.", param="stream")
    if body.get("background"):
        raise bad_request("Background responses are not supported.", param="background")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise bad_request("`previous_response_id` must be a string.", param="previous_response_id")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("`instructions` must be a string.", param="instructions")
    params: dict[str, Any] = {k: body[k] for k in PASSED if body.get(k) is not None}
    params.update({RENAMED[k]: body[k] for k in RENAMED if body.get(k) is not None})
    params.update(_tool_params(body))
    params.update(_format_params(body))
    return ChatRequest(
        model=model,
        system=instructions or None,
        messages=input_messages(body.get("input")),
        params=params,
        stream=stream,
        store=store,
        previous_response_id=previous,
        echo=response_objects.echo(body),
    )


def _tool_params(body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("`tools` must be a list.", param="tools")
        if tools:
            out["tools"] = [chat_tool(tool, index) for index, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = chat_tool_choice(choice)
    return out


def chat_tool(tool: Any, index: int) -> dict[str, Any]:
    """A Responses function tool as a chat-completions one (the only kind an upstream model
    called through chat completions runs)."""
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        raise bad_request(
            f"tools[{index}]: only function tools are supported (got {kind!r}).",
            param=f"tools[{index}]",
        )
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"tools[{index}]: a function tool needs a name.", param="tools")
    function = {"name": name}
    function.update({k: tool[k] for k in ("description", "parameters", "strict") if k in tool})
    return {"type": "function", "function": function}


def chat_tool_choice(choice: Any) -> Any:
    """``auto``, ``none``, ``required`` or one named function."""
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request(
        "`tool_choice` must be auto, none, required or a function.", param="tool_choice"
    )


def _format_params(body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort"):
        out["reasoning_effort"] = reasoning["effort"]
    text = body.get("text")
    if not isinstance(text, Mapping):
        return out
    if text.get("verbosity"):
        out["verbosity"] = text["verbosity"]
    form = text.get("format")
    if isinstance(form, Mapping) and form.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(form, Mapping) and form.get("type") == "json_schema":
        schema = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    return out


# --- input items -------------------------------------------------------------------------------


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` (a string or a list of items) as chat messages: messages as messages, each
    run of ``function_call`` items as one assistant message's tool calls (after the text of
    the assistant message before them), ``function_call_output`` as tool messages, a
    ``reasoning`` item as the reasoning of the assistant message after it."""
    if isinstance(value, str):
        if not value:
            raise bad_request("`input` is empty.", param="input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("`input` must be a string or a non-empty list of items.", param="input")
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise bad_request(f"input[{index}] must be an object.", param="input")
        kind = item_type(item)
        if kind == "reasoning":
            reasoning.append(_reasoning_text(item))
            continue
        if kind == "message":
            message = _message(item, index)
        elif kind == "function_call":
            _add_call(messages, item, index)
            _attach_reasoning(messages[-1], reasoning)
            continue
        elif kind == "function_call_output":
            message = _call_output(item, index)
        else:
            raise bad_request(
                f"input[{index}]: items of type {kind!r} are not supported (messages, "
                "function_call, function_call_output and reasoning are).",
                param="input",
            )
        if message["role"] == "assistant":
            _attach_reasoning(message, reasoning)
        messages.append(message)
    return messages


def _attach_reasoning(message: dict[str, Any], reasoning: list[str]) -> None:
    text = "\n".join(t for t in reasoning if t)
    if text and message.get("role") == "assistant":
        message["reasoning_content"] = text
    reasoning.clear()


def _reasoning_text(item: Mapping[str, Any]) -> str:
    parts = [*(item.get("content") or ()), *(item.get("summary") or ())]
    return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping))


def _message(item: Mapping[str, Any], index: int) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise bad_request(f"input[{index}]: unknown role {role!r}.", param="input")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise bad_request(f"input[{index}]: content must be a string or a list.", param="input")
    parts = [_part(part, index) for part in content]
    if role != "user" or all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p.get("text", "") for p in parts)}
    return {"role": role, "content": parts}


def _part(part: Any, index: int) -> dict[str, Any]:
    """A content part as chat completions spells it."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind in ("input_text", "output_text", "text") and isinstance(part, Mapping):
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "refusal" and isinstance(part, Mapping):
        return {"type": "text", "text": str(part.get("refusal", ""))}
    if kind == "input_image" and isinstance(part, Mapping) and part.get("image_url"):
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file" and isinstance(part, Mapping) and part.get("file_data"):
        file = {k: part[k] for k in ("file_data", "filename") if part.get(k)}
        return {"type": "file", "file": file}
    raise bad_request(
        f"input[{index}]: content parts of type {kind!r} are not supported here "
        "(text, images by URL or data URL, files as file_data are).",
        param="input",
    )


def _add_call(messages: list[dict[str, Any]], item: Mapping[str, Any], index: int) -> None:
    call_id, name = item.get("call_id"), item.get("name")
    arguments = item.get("arguments", "")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise bad_request(f"input[{index}]: a function_call needs call_id and name.", param="input")
    if not isinstance(arguments, str):
        raise bad_request(f"input[{index}]: arguments must be a JSON string.", param="input")
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        if last.get("content") == "":
            last["content"] = None
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(item: Mapping[str, Any], index: int) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"input[{index}]: a function_call_output needs call_id.", param="input")
    if isinstance(output, list):
        output = "".join(_output_text(part, index) for part in output)
    if not isinstance(output, str):
        raise bad_request(f"input[{index}]: output must be a string.", param="input")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _output_text(part: Any, index: int) -> str:
    """A text part of a function call's output (a tool message of chat completions holds text
    only: an image or a file there is refused, never dropped)."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind in ("input_text", "output_text", "text") and isinstance(part, Mapping):
        return str(part.get("text", ""))
    raise bad_request(
        f"input[{index}]: function_call_output parts of type {kind!r} are not supported "
        "(text parts are).",
        param="input",
    )


# --- the reply ---------------------------------------------------------------------------------


def usage_object(usage: tuple[int, int, int] | None) -> dict[str, Any] | None:
    """Chat completions' (prompt, completion, cached) tokens as Responses usage."""
    if usage is None:
        return None
    prompt, completion, cached = usage
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


@dataclass(kw_only=True)
class Head:
    """What every form of one response shares: its id, model and the request's echoed fields."""

    id: str
    model: str
    echo: Mapping[str, Any]
    store: bool = True
    created_at: int = field(default_factory=lambda: int(time.time()))

    def item_id(self, prefix: str, index: int) -> str:
        return f"{prefix}_{self.id.removeprefix(RESPONSE_PREFIX)[-16:]}{index}"

    def response(
        self,
        output: list[dict[str, Any]],
        *,
        status: str,
        usage: dict[str, Any] | None = None,
        incomplete: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The response object with this head's id, model and repeated request fields."""
        return response_objects.resource(
            response_id=self.id,
            model=self.model,
            created_at=self.created_at,
            echoed=self.echo,
            store=self.store,
            output=output,
            status=status,
            usage=usage,
            incomplete=incomplete,
            error=error,
        )


def output_items(head: Head, message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat-completions assistant message as Responses output items: its reasoning, its
    text, its tool calls."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(head, len(items), str(message["reasoning_content"])))
    if message.get("content"):
        items.append(message_item(head, len(items), str(message["content"])))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            call_item(
                head,
                len(items),
                str(call.get("id")),
                str(function.get("name")),
                str(function.get("arguments") or ""),
            )
        )
    return items


def response_object(
    head: Head,
    message: Mapping[str, Any],
    usage: tuple[int, int, int] | None,
    finish_reason: str | None,
) -> dict[str, Any]:
    """The whole Responses object for a chat-completions reply."""
    incomplete = FINISHED.get(finish_reason or "")
    return head.response(
        output_items(head, message),
        status="incomplete" if incomplete else "completed",
        usage=usage_object(usage),
        incomplete=incomplete,
    )


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(head: Head, index: int, text: str, status: str = "completed") -> dict[str, Any]:
    content = [text_part(text)] if status == "completed" else []
    return {
        "id": head.item_id("msg", index),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def reasoning_item(head: Head, index: int, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {
        "id": head.item_id("rs", index),
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": content,
    }


def call_item(
    head: Head, index: int, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": head.item_id("fc", index),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def first_message(messages: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The first history message (after any system or developer ones)."""
    for message in messages:
        if message.get("role") not in ("system", "developer"):
            return message
    return messages[0] if messages else {}
