"""A ``POST /v1/messages`` or ``POST /v1/messages/count_tokens`` body, every field and block
checked (one function for both routes, so a count is refused exactly where a message is).

The fields Messages shares with chat completions are checked by chat completions' rules
(``fields.PARAM_CHECKS``); every content block by its type (text, image, tool_use,
tool_result, thinking, redacted_thinking), with the cache marks and citations any block may
carry. Today's anthropic SDK's parameters are known: those chat completions can carry
(``output_config``'s effort and JSON schema format) are passed on, those with nothing to do
behind chat completions are checked and accepted (``cache_control``, ``service_tier``,
``speed``, ``diagnostics``, ``context_management``), and those no upstream reached through chat
completions can honour (``container``, ``inference_geo``, ``mcp_servers``) are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recap.workers.serve.errors import ServeError
from recap.workers.serve.validation.fields import (
    PARAM_CHECKS,
    Check,
    anything,
    boolean,
    cache_control,
    fields,
    function_definition,
    integer,
    name,
    obj,
    objects,
    one_of,
    optional,
    refuse,
    required,
    short,
    string,
    strings,
)

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
MIN_THINKING_BUDGET = 1_024  # Anthropic's least budget_tokens for extended thinking
# Parameters no upstream reached through chat completions can honour: refused by name.
UNCARRIED = {
    "container": "code-execution containers run on Anthropic's servers only",
    "inference_geo": "the upstream's region is chosen by its configuration, not per request",
    "mcp_servers": "recap serve does not call MCP servers for the model",
    "billing_policy": "the upstream bills the key recap serve is configured with",
    "compaction": "a compaction request returns Anthropic's signed block; Recap compacts itself",
    "fallbacks": "the upstream's model is the one the request names",
    "fallback_credit_token": "the upstream's model is the one the request names",
    "thread": "threads are kept on Anthropic's servers only",
}


def _system(value: Any, path: str) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise refuse(path, "a string or a list of text blocks")
    for index, block in enumerate(value):
        where = f"{path}.{index}"
        obj(block, where)
        required(block, where, ("type", "text"))
        fields(block, where, {"type": one_of("text"), **TEXT_BLOCK})


def _metadata(value: Any, path: str) -> None:
    obj(value, path)
    fields(value, path, {"user_id": optional(PARAM_CHECKS["user"])})


def _tool(value: Any, path: str) -> None:
    obj(value, path)
    if value.get("type") not in (None, "custom"):
        return  # a server tool: refused by name when converted
    function_definition(value, path)
    fields(value, path, {"cache_control": optional(cache_control), "type": optional(string)})


def _tools(value: Any, path: str) -> None:
    if not isinstance(value, list):
        raise refuse(path, "a list")
    for index, tool in enumerate(value):
        _tool(tool, f"{path}.{index}")


def _tool_choice(value: Any, path: str) -> None:
    obj(value, path)
    required(value, path, ("type",))
    one_of("auto", "any", "tool", "none")(value["type"], f"{path}.type")
    if value["type"] == "tool":
        required(value, path, ("name",))
    fields(value, path, {"name": name, "disable_parallel_tool_use": optional(boolean)})


def _thinking(value: Any, path: str) -> None:
    obj(value, path)
    required(value, path, ("type",))
    one_of("enabled", "disabled", "adaptive")(value["type"], f"{path}.type")
    if value["type"] == "enabled":
        required(value, path, ("budget_tokens",))
    fields(value, path, {"budget_tokens": optional(integer(MIN_THINKING_BUDGET))})


def _output_format(value: Any, path: str) -> None:
    obj(value, path)
    required(value, path, ("type", "schema"))
    fields(value, path, {"type": one_of("json_schema"), "schema": obj})


def _output_config(value: Any, path: str) -> None:
    obj(value, path)
    fields(value, path, {"effort": optional(one_of(*EFFORTS)), "format": optional(_output_format)})


def _diagnostics(value: Any, path: str) -> None:
    obj(value, path)
    fields(value, path, {"previous_message_id": optional(string)})


def _context_management(value: Any, path: str) -> None:
    obj(value, path)
    fields(value, path, {"edits": objects})


def _uncarried(key: str) -> Check:
    def check(value: Any, path: str) -> None:
        if value is not None and value != []:
            raise ServeError(
                400, f"{path}: not supported by recap serve ({UNCARRIED[key]}).", param=key
            )

    return check


COMMON: dict[str, Check] = {
    "model": name,
    "system": optional(_system),
    "tools": optional(_tools),
    "tool_choice": optional(_tool_choice),
    "thinking": optional(_thinking),
    "cache_control": optional(cache_control),
    "output_config": optional(_output_config),
    "speed": optional(one_of("standard", "fast")),
    "context_management": optional(_context_management),
    "mcp_servers": _uncarried("mcp_servers"),
    "billing_policy": _uncarried("billing_policy"),
}
CREATE: dict[str, Check] = {
    **COMMON,
    "max_tokens": integer(1),
    "stream": optional(boolean),
    "temperature": optional(PARAM_CHECKS["temperature"]),
    "top_p": optional(PARAM_CHECKS["top_p"]),
    "top_k": optional(integer(0)),
    "stop_sequences": optional(strings),
    "metadata": optional(_metadata),
    "service_tier": optional(one_of("auto", "standard_only")),
    "diagnostics": optional(_diagnostics),
    **{key: _uncarried(key) for key in UNCARRIED if key not in COMMON},
}
COUNT: dict[str, Check] = {
    **COMMON,
    "compaction": anything,  # count_tokens ignores it, as Anthropic's does
}
CREATE_FIELDS = frozenset({*CREATE, "messages"})
COUNT_FIELDS = frozenset({*COUNT, "messages"})


def check_body(body: Mapping[str, Any], *, count: bool = False) -> None:
    """Every field of a Messages (``count``: a count_tokens) body and every block; a 400 in
    Anthropic's wording naming the first that is wrong."""
    unknown = sorted(set(body) - (COUNT_FIELDS if count else CREATE_FIELDS))
    if unknown:
        raise ServeError(400, f"{unknown[0]}: Extra inputs are not permitted", param=unknown[0])
    required(body, "", ("model", "messages") if count else ("model", "max_tokens", "messages"))
    fields(body, "", COUNT if count else CREATE)
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise refuse("messages", "a non-empty list of messages")
    for index, message in enumerate(messages):
        check_message(message, f"messages.{index}")


def check_message(message: Any, path: str) -> None:
    obj(message, path)
    required(message, path, ("role", "content"))
    role = message["role"]
    one_of("user", "assistant")(role, f"{path}.role")
    content = message["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise refuse(f"{path}.content", "a string or a non-empty list of content blocks")
    allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
    for index, block in enumerate(content):
        check_block(block, f"{path}.content.{index}", allowed)


def check_block(block: Any, path: str, allowed: Mapping[str, Check]) -> None:
    """A block of a type this role may send, with its fields of their types."""
    obj(block, path)
    kind = block.get("type")
    rule = allowed.get(kind) if isinstance(kind, str) else None
    if rule is None:
        raise ServeError(
            400,
            f"{path}: blocks of type {short(kind)} are not supported here "
            f"({', '.join(allowed)} are).",
            param="messages",
        )
    fields(block, path, {"cache_control": optional(cache_control)})
    rule(block, path)


TEXT_BLOCK: dict[str, Check] = {
    "text": string,
    "cache_control": optional(cache_control),
    "citations": optional(objects),
}


def _text_block(block: Mapping[str, Any], path: str) -> None:
    required(block, path, ("text",))
    fields(block, path, TEXT_BLOCK)


def _image_source(source: Any, path: str) -> None:
    obj(source, path)
    required(source, path, ("type",))
    one_of("base64", "url")(source["type"], f"{path}.type")
    if source["type"] == "base64":
        required(source, path, ("media_type", "data"))
        fields(source, path, {"media_type": one_of(*IMAGE_TYPES), "data": name})
    else:
        required(source, path, ("url",))
        fields(source, path, {"url": name})


def _image_block(block: Mapping[str, Any], path: str) -> None:
    required(block, path, ("source",))
    _image_source(block["source"], f"{path}.source")


def _tool_result(block: Mapping[str, Any], path: str) -> None:
    required(block, path, ("tool_use_id",))
    fields(block, path, {"tool_use_id": name, "is_error": optional(boolean)})
    content = block.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise refuse(f"{path}.content", "a string or a list of content blocks")
    for index, inner in enumerate(content):
        check_block(inner, f"{path}.content.{index}", RESULT_BLOCKS)


def _tool_use(block: Mapping[str, Any], path: str) -> None:
    required(block, path, ("id", "name", "input"))
    fields(block, path, {"id": name, "name": name, "input": obj})


def _thinking_block(block: Mapping[str, Any], path: str) -> None:
    """Its text a string; its signature a string or null (a reply of an upstream that signs
    nothing comes back to the client with none)."""
    required(block, path, ("thinking",))
    fields(block, path, {"thinking": string, "signature": optional(string)})


def _redacted_thinking(block: Mapping[str, Any], path: str) -> None:
    required(block, path, ("data",))
    fields(block, path, {"data": string})


def _passed_block(block: Mapping[str, Any], path: str) -> None:
    """A block kept in a tool result as the client sent it (a document, a search result)."""
    return None


RESULT_BLOCKS: dict[str, Check] = {
    "text": _text_block,
    "image": _image_block,
    "document": _passed_block,
    "search_result": _passed_block,
}
USER_BLOCKS: dict[str, Check] = {
    "text": _text_block,
    "image": _image_block,
    "tool_result": _tool_result,
}
ASSISTANT_BLOCKS: dict[str, Check] = {
    "text": _text_block,
    "tool_use": _tool_use,
    "thinking": _thinking_block,
    "redacted_thinking": _redacted_thinking,
}


def check_converted(messages: list[dict[str, Any]]) -> None:
    """The request as chat messages: every media part readable (the base64 decodes, the type
    is one the providers take; what counting and storing read), every tool result answering a
    tool_use before it (Anthropic refuses one that answers none)."""
    from recap.core.counting.media import check_parts
    from recap.core.errors import InputError
    from recap.core.request.validate import check_tool_pairing

    try:
        for index, message in enumerate(messages):
            content = message.get("content")
            if isinstance(content, list):
                check_parts(content, f"messages[{index}]")
        check_tool_pairing(messages, "")
    except InputError as exc:
        raise ServeError(400, str(exc), param="messages") from None
