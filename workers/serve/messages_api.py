"""Anthropic's Messages API over chat completions (pure): a ``POST /v1/messages`` body as a
chat-completions request, and a chat-completions reply (whole, or chunk by chunk) as an
Anthropic message and its stream of events; errors in Anthropic's format.

Blocks map as litellm maps them: ``text`` and ``image`` blocks as content parts, ``tool_use``
as tool calls (the input as a JSON string, written the one way ``arguments`` writes it, so the
reply a client sends back is recognized as the stored one), ``tool_result`` as tool messages,
``thinking`` as the message's reasoning (its signed blocks kept as ``thinking_blocks``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse

from recap.core.request.native_anthropic import arguments_of, input_of
from recap.workers.serve.chunks import chunk_usage, first_choice_deltas
from recap.workers.serve.errors import ServeError
from recap.workers.serve.validation import messages as rules

MESSAGE_PREFIX = "msg_"
KNOWN_FIELDS = rules.CREATE_FIELDS  # the fields of a Messages body (``validation.messages``)
COUNT_FIELDS = rules.COUNT_FIELDS  # and of a count_tokens body
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
# Thinking budgets as reasoning efforts (the upstream is called through chat completions).
EFFORT_BUDGETS = ((2_048, "low"), (8_192, "medium"))
# ``output_config.effort`` as a reasoning effort: past high, chat completions' highest.
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
SCHEMA_NAME = "output"  # chat completions' json_schema needs a name; Anthropic's format has none
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def invalid(message: str) -> ServeError:
    return ServeError(400, message)


def error_body(error: ServeError) -> dict[str, Any]:
    """Anthropic's error object for an error of recap serve."""
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else None)
    return {
        "type": "error",
        "error": {"type": kind or "invalid_request_error", "message": error.message},
    }


def error_response(error: ServeError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=error.status)


def canonical_reply(message: dict[str, Any]) -> dict[str, Any]:
    """A reply as stored for an Anthropic client: its calls' arguments written as the client
    will send their input back."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        function = dict(call.get("function") or {})
        function["arguments"] = arguments_of(input_of(function.get("arguments")))
        fixed.append({**call, "function": function})
    return {**message, "tool_calls": fixed}


@dataclass(kw_only=True)
class ChatRequest:
    """A Messages request as chat completions."""

    model: str
    messages: list[dict[str, Any]]  # the system part first, when there is one
    params: dict[str, Any]
    stream: bool
    tools: list[dict[str, Any]] | None = None


def chat_request(body: Mapping[str, Any], *, count: bool = False) -> ChatRequest:
    """The chat-completions request for a Messages body (``count``: a count_tokens body,
    which has no ``max_tokens``); an Anthropic-format 400 for what it cannot carry."""
    rules.check_body(body, count=count)  # every field and block, before anything is read
    model, stream = body["model"], body.get("stream") or False
    params: dict[str, Any] = {}
    if not count:
        params["max_tokens"] = body["max_tokens"]
        for key in ("temperature", "top_p"):
            if body.get(key) is not None:
                params[key] = body[key]
        if body.get("stop_sequences"):
            params["stop"] = list(body["stop_sequences"])
        metadata = body.get("metadata")
        if isinstance(metadata, Mapping) and metadata.get("user_id"):
            params["user"] = str(metadata["user_id"])
    tools = chat_tools(body.get("tools"))
    if tools:
        params["tools"] = tools
    params.update(tool_choice(body.get("tool_choice")))
    effort = reasoning_effort(body.get("thinking"))
    if effort is not None:
        params["reasoning_effort"] = effort
    params.update(output_params(body.get("output_config")))
    messages = system_messages(body.get("system")) + history(body.get("messages"))
    rules.check_converted(messages)
    return ChatRequest(model=model, messages=messages, params=params, stream=stream, tools=tools)


def output_params(config: Any) -> dict[str, Any]:
    """``output_config`` as chat completions' parameters: its effort as ``reasoning_effort``,
    its JSON schema as a ``json_schema`` response format."""
    if not isinstance(config, Mapping):
        return {}
    out: dict[str, Any] = {}
    if config.get("effort"):
        out["reasoning_effort"] = EFFORTS[config["effort"]]
    form = config.get("format")
    if isinstance(form, Mapping):
        schema = {"name": SCHEMA_NAME, "schema": form["schema"]}
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    return out


def system_messages(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        text = "\n\n".join(
            str(b.get("text", "")) for b in system if isinstance(b, Mapping) and b.get("text")
        )
        return [{"role": "system", "content": text}] if text else []
    raise invalid("system: Input should be a string or a list of text blocks")


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise invalid("tools: Input should be a valid list")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise invalid(f"tools.{index}.name: Field required")
        if tool.get("type") not in (None, "custom"):
            raise invalid(
                f"tools.{index}: only client tools (name, description, input_schema) are "
                f"supported, not {tool.get('type')!r}"
            )
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool.get("input_schema") or {"type": "object"}
        out.append({"type": "function", "function": function})
    return out


def tool_choice(choice: Any) -> dict[str, Any]:
    if choice is None:
        return {}
    if not isinstance(choice, Mapping):
        raise invalid("tool_choice: Input should be an object")
    kind = choice.get("type")
    out: dict[str, Any] = {}
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool" and choice.get("name"):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise invalid("tool_choice: type must be auto, any, tool or none")
    if choice.get("disable_parallel_tool_use") and kind != "none":
        out["parallel_tool_calls"] = False
    return out


def reasoning_effort(thinking: Any) -> str | None:
    """An extended-thinking budget as a reasoning effort (none when thinking is off)."""
    if not isinstance(thinking, Mapping) or thinking.get("type") not in ("enabled", "adaptive"):
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int):
        return "medium"
    for limit, effort in EFFORT_BUDGETS:
        if budget <= limit:
            return effort
    return "high"


def history(messages: Any) -> list[dict[str, Any]]:
    """The ``messages`` as chat messages: a user message's ``tool_result`` blocks as tool
    messages before the rest of it, an assistant message's blocks as its text, reasoning and
    tool calls."""
    if not isinstance(messages, list) or not messages:
        raise invalid("messages: at least one message is required")
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            raise invalid(f"messages.{index}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise invalid(f"messages.{index}.content: Input should be a string or a list")
        if message["role"] == "user":
            out += _user(content, index)
        else:
            out.append(_assistant(content, index))
    return out


def _user(blocks: list[Any], index: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for number, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        where = f"messages.{index}.content.{number}"
        if kind == "tool_result" and isinstance(block, Mapping):
            results.append(_tool_result(block, where))
        elif kind == "text" and isinstance(block, Mapping):
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image" and isinstance(block, Mapping):
            parts.append(_image(block, where))
        else:
            raise invalid(f"{where}: blocks of type {kind!r} are not supported here")
    if not parts:
        return results
    if len(parts) == 1 and parts[0]["type"] == "text":
        return [*results, {"role": "user", "content": parts[0]["text"]}]
    return [*results, {"role": "user", "content": parts}]


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if isinstance(source, Mapping) and source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif isinstance(source, Mapping) and source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise invalid(f"{where}.source: an image is base64 data or a URL")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.tool_use_id: Field required")
    content = block.get("content", "")
    if isinstance(content, list):
        content = "\n".join(
            str(b.get("text", "")) for b in content if isinstance(b, Mapping) and "text" in b
        )
    if not isinstance(content, str):
        raise invalid(f"{where}.content: Input should be a string or a list of blocks")
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _assistant(blocks: list[Any], index: int) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    signed: list[dict[str, Any]] = []
    for number, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if not isinstance(block, Mapping):
            raise invalid(f"messages.{index}.content.{number}: Input should be an object")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name")),
                        "arguments": arguments_of(block.get("input")),
                    },
                }
            )
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking", "")))
            if block.get("signature"):
                signed.append(
                    {
                        "type": "thinking",
                        "thinking": block["thinking"],
                        "signature": block["signature"],
                    }
                )
        elif kind == "redacted_thinking":
            signed.append({"type": "redacted_thinking", "data": block.get("data")})
        else:
            raise invalid(
                f"messages.{index}.content.{number}: blocks of type {kind!r} are not supported"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if thoughts and any(thoughts):
        message["reasoning_content"] = "\n".join(thoughts)
    if signed:
        message["thinking_blocks"] = signed
    if message["content"] is None and not calls:
        message["content"] = ""
    return message


# --- the reply ---------------------------------------------------------------------------------


def new_message_id() -> str:
    return MESSAGE_PREFIX + uuid.uuid4().hex[:24]


def usage_object(usage: tuple[int, int, int] | None, fallback_input: int = 0) -> dict[str, Any]:
    prompt, completion, cached = usage if usage is not None else (fallback_input, 0, 0)
    return {
        "input_tokens": max(prompt - cached, 0),
        "output_tokens": completion,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def content_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat-completions assistant message as Anthropic content blocks."""
    blocks: list[dict[str, Any]] = []
    signed = message.get("thinking_blocks")
    if isinstance(signed, list) and signed:
        blocks += [dict(b) for b in signed if isinstance(b, Mapping)]
    elif message.get("reasoning_content"):
        blocks.append(
            {"type": "thinking", "thinking": str(message["reasoning_content"]), "signature": ""}
        )
    if message.get("content"):
        blocks.append({"type": "text", "text": str(message["content"])})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id")),
                "name": str(function.get("name")),
                "input": input_of(function.get("arguments")),
            }
        )
    return blocks


def message_object(
    message_id: str,
    model: str,
    message: Mapping[str, Any],
    usage: tuple[int, int, int] | None,
    finish_reason: str | None,
) -> dict[str, Any]:
    """The Anthropic message for a chat-completions reply."""
    stop = STOP_REASONS.get(finish_reason or "stop", "end_turn")
    if message.get("tool_calls"):
        stop = "tool_use"
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(message),
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage_object(usage),
    }


# --- the stream --------------------------------------------------------------------------------


@dataclass(kw_only=True)
class MessageEvents:
    """Chat-completions chunks (as JSON objects) in, Anthropic stream events out."""

    message_id: str
    model: str
    input_tokens: int = 0  # Recap's count of the request, until the upstream reports its own
    index: int = -1
    kind: str | None = None  # the open block's type
    calls: dict[int, int] = field(default_factory=dict)  # chat tool-call index -> block index
    usage: tuple[int, int, int] | None = None
    finish_reason: str | None = None
    saw_call: bool = False

    def start(self) -> list[dict[str, Any]]:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage_object(None, self.input_tokens), "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def _open(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.index += 1
        self.kind = block["type"]
        events.append({"type": "content_block_start", "index": self.index, "content_block": block})
        return events

    def _close(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        self.kind = None
        return [{"type": "content_block_stop", "index": self.index}]

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        self.usage = chunk_usage(chunk) or self.usage
        for finish, delta in first_choice_deltas(chunk):
            self.finish_reason = finish or self.finish_reason
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                if self.kind != "thinking":
                    events += self._open({"type": "thinking", "thinking": "", "signature": ""})
                delta_event = {"type": "thinking_delta", "thinking": str(thought)}
                events.append(self._delta(delta_event))
            if delta.get("content"):
                if self.kind != "text":
                    events += self._open({"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": str(delta["content"])}))
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
        return events

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _call(self, call: Mapping[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        position = call.get("index")
        position = position if isinstance(position, int) else len(self.calls)
        function = call.get("function") or {}
        if position not in self.calls:
            block = {
                "type": "tool_use",
                "id": str(call.get("id") or f"toolu_{position}"),
                "name": str(function.get("name") or ""),
                "input": {},
            }
            events += self._open(block)
            self.calls[position] = self.index
            self.saw_call = True
        arguments = function.get("arguments")
        if arguments and self.calls[position] == self.index and self.kind == "tool_use":
            events.append(self._delta({"type": "input_json_delta", "partial_json": str(arguments)}))
        return events

    def finish(self) -> list[dict[str, Any]]:
        events = self._close()
        stop = "tool_use" if self.saw_call else STOP_REASONS.get(self.finish_reason or "stop")
        usage = usage_object(self.usage, self.input_tokens)
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop or "end_turn", "stop_sequence": None},
                "usage": usage,
            }
        )
        events.append({"type": "message_stop"})
        return events

    def failed(self, error: ServeError) -> list[dict[str, Any]]:
        return [error_body(error)]


def sse(event: Mapping[str, Any]) -> bytes:
    """One server-sent event, named by its type as Anthropic names them."""
    payload = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['type']}\ndata: {payload}\n\n".encode()
