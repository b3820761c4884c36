"""A ``POST /v1/responses`` body, every field and input item checked (OpenAI's error format).

The fields Responses shares with chat completions are checked by chat completions' rules
(``fields.PARAM_CHECKS``: ``max_output_tokens`` by ``max_tokens``'); input items by their type:
messages and their content parts, function calls and their outputs, reasoning items with their
summary and content. What chat completions cannot carry (other tools, other item types) is
refused by ``responses_api`` with its own wording, after these checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recap.workers.serve.errors import bad_request
from recap.workers.serve.validation.fields import (
    PARAM_CHECKS,
    Check,
    boolean,
    fields,
    function_definition,
    metadata,
    name,
    obj,
    one_of,
    optional,
    refuse,
    required,
    short,
    string,
    strings,
)

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
IMAGE_DETAILS = ("low", "high", "auto")
VERBOSITY = ("low", "medium", "high")
TRUNCATION = ("auto", "disabled")
FORMATS = ("text", "json_object", "json_schema")


def _text_format(value: Any, path: str) -> None:
    obj(value, path)
    required(value, path, ("type",))
    one_of(*FORMATS)(value["type"], f"{path}.type")
    if value["type"] == "json_schema":
        required(value, path, ("name",))
        fields(
            value,
            path,
            {
                "name": name,
                "schema": obj,
                "strict": optional(boolean),
                "description": optional(string),
            },
        )


def _text(value: Any, path: str) -> None:
    obj(value, path)
    fields(
        value, path, {"format": optional(_text_format), "verbosity": optional(one_of(*VERBOSITY))}
    )


def _reasoning(value: Any, path: str) -> None:
    obj(value, path)
    fields(
        value,
        path,
        {
            "effort": optional(string),
            "summary": optional(string),
            "generate_summary": optional(string),
        },
    )


def _tool(value: Any, path: str) -> None:
    obj(value, path)
    if value.get("type") == "function":
        function_definition(value, path)


def _tools(value: Any, path: str) -> None:
    if not isinstance(value, list):
        raise refuse(path, "a list")
    for index, tool in enumerate(value):
        _tool(tool, f"{path}[{index}]")


def _tool_choice(value: Any, path: str) -> None:
    if isinstance(value, str):
        one_of("auto", "none", "required")(value, path)
        return
    obj(value, path)
    if value.get("type") == "function":
        name(value.get("name"), f"{path}.name")


def _stream_options(value: Any, path: str) -> None:
    obj(value, path)
    fields(value, path, {"include_obfuscation": optional(boolean)})


BODY: dict[str, Check] = {
    "model": name,
    "instructions": optional(string),
    "stream": optional(boolean),
    "store": optional(boolean),
    "background": optional(boolean),
    "parallel_tool_calls": optional(PARAM_CHECKS["parallel_tool_calls"]),
    "previous_response_id": optional(name),
    "metadata": optional(metadata),
    "temperature": optional(PARAM_CHECKS["temperature"]),
    "top_p": optional(PARAM_CHECKS["top_p"]),
    "top_logprobs": optional(PARAM_CHECKS["top_logprobs"]),
    "max_output_tokens": optional(PARAM_CHECKS["max_tokens"]),
    "user": optional(PARAM_CHECKS["user"]),
    "service_tier": optional(PARAM_CHECKS["service_tier"]),
    "tools": optional(_tools),
    "tool_choice": optional(_tool_choice),
    "text": optional(_text),
    "reasoning": optional(_reasoning),
    "truncation": optional(one_of(*TRUNCATION)),
    "include": optional(strings),
    "stream_options": optional(_stream_options),
    "prompt_cache_key": optional(string),
    "prompt_cache_retention": optional(string),
    "safety_identifier": optional(string),
}


def check_body(body: Mapping[str, Any]) -> None:
    """Every field of a Responses body and every input item; a 400 naming the first that is
    wrong. Fields this table does not know are left to ``responses_api`` (refused by name)."""
    required(body, "", ("model", "input"))
    fields(body, "", BODY)
    check_input(body["input"], "input")


def check_input(value: Any, path: str) -> None:
    """A non-empty string, or a non-empty list of items of known shapes."""
    if isinstance(value, str):
        if not value:
            raise refuse(path, "a non-empty string or a non-empty list of items")
        return
    if not isinstance(value, list) or not value:
        raise refuse(path, "a non-empty string or a non-empty list of items")
    for index, item in enumerate(value):
        check_item(item, f"{path}[{index}]")


def item_type(item: Mapping[str, Any]) -> Any:
    """An input item's type: as given, else a message (it has a role) or an item reference (an
    ``id`` alone, whose ``type`` the specification lets a client leave out)."""
    kind = item.get("type")
    if kind is not None:
        return kind
    return "item_reference" if "role" not in item and "id" in item else "message"


def check_item(item: Any, path: str) -> None:
    obj(item, path)
    kind = item_type(item)
    rule = ITEMS.get(kind) if isinstance(kind, str) else None
    if rule is None:
        raise bad_request(
            f"{path}: items of type {short(kind)} are not supported (message, function_call, "
            "function_call_output and reasoning are).",
            param="input",
        )
    fields(item, path, {"id": optional(string), "status": optional(string)})
    rule(item, path)


def _message(item: Mapping[str, Any], path: str) -> None:
    required(item, path, ("role", "content"))
    one_of(*ROLES)(item["role"], f"{path}.role")
    content = item["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise refuse(f"{path}.content", "a string or a non-empty list of content parts")
    for index, part in enumerate(content):
        check_part(part, f"{path}.content[{index}]")


def check_part(part: Any, path: str) -> None:
    """A content part of a known type with its fields of their types."""
    obj(part, path)
    kind = part.get("type")
    rule = PARTS.get(kind) if isinstance(kind, str) else None
    if rule is None:
        raise bad_request(
            f"{path}: content parts of type {short(kind)} are not supported here (text, images "
            "by URL or data URL, files as file_data are).",
            param="input",
        )
    rule(part, path)


def _text_part(part: Mapping[str, Any], path: str) -> None:
    required(part, path, ("text",))
    fields(part, path, {"text": string})


def _refusal_part(part: Mapping[str, Any], path: str) -> None:
    required(part, path, ("refusal",))
    fields(part, path, {"refusal": string})


def _image_part(part: Mapping[str, Any], path: str) -> None:
    required(part, path, ("image_url",))
    fields(part, path, {"image_url": name, "detail": optional(one_of(*IMAGE_DETAILS))})


def _file_part(part: Mapping[str, Any], path: str) -> None:
    if "file_data" not in part and ("file_url" in part or "file_id" in part):
        raise bad_request(
            f"{path}: an input_file by file_url or file_id is not supported (files are given "
            "inline as file_data).",
            param="input",
        )
    required(part, path, ("file_data",))
    fields(part, path, {"file_data": name, "filename": optional(string)})


PARTS: dict[str, Check] = {
    **dict.fromkeys(TEXT_PARTS, _text_part),
    "refusal": _refusal_part,
    "input_image": _image_part,
    "input_file": _file_part,
}


def _function_call(item: Mapping[str, Any], path: str) -> None:
    required(item, path, ("call_id", "name"))
    fields(item, path, {"call_id": name, "name": name, "arguments": string})


def _call_output(item: Mapping[str, Any], path: str) -> None:
    required(item, path, ("call_id", "output"))
    fields(item, path, {"call_id": name})
    output = item["output"]
    if isinstance(output, str):
        return
    if not isinstance(output, list) or not output:
        raise refuse(f"{path}.output", "a string or a non-empty list of content parts")
    for index, part in enumerate(output):
        _output_part(part, f"{path}.output[{index}]")


def _output_part(part: Any, path: str) -> None:
    """A part of a function call's output: its text parts are sent (their text a string),
    its other parts (images, files) have a string type and are left out, as before."""
    obj(part, path)
    required(part, path, ("type",))
    string(part["type"], f"{path}.type")
    if part["type"] in TEXT_PARTS:
        _text_part(part, path)


def _texts(kind: str) -> Check:
    """A list of ``{"type": kind, "text": str}`` objects (a reasoning item's summary or
    content)."""

    def check(value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise refuse(path, f"a list of {kind} parts")
        for index, part in enumerate(value):
            where = f"{path}[{index}]"
            obj(part, where)
            required(part, where, ("text",))
            fields(part, where, {"type": one_of(kind), "text": string})

    return check


def _reasoning_item(item: Mapping[str, Any], path: str) -> None:
    fields(
        item,
        path,
        {
            "summary": _texts("summary_text"),
            "content": optional(_texts("reasoning_text")),
            "encrypted_content": optional(string),
        },
    )


ITEMS: dict[str, Check] = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _call_output,
    "reasoning": _reasoning_item,
}
