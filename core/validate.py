"""Validation of OpenAI-format messages on the way in (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from core import limits, media
from core.errors import InputError
from core.records import ROLES

KNOWN_KEYS = {"role", "content", "tool_calls", "tool_call_id", "name", "id"}


def check_message(message: Any, where: str) -> dict[str, Any]:
    """One message's shape: a role, string/list/None content, well-formed tool calls."""
    if not isinstance(message, Mapping):
        raise InputError(f"{where}: a message must be a JSON object")
    role = message.get("role")
    if role not in ROLES:
        raise InputError(f"{where}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise InputError(f"{where}: content must be a string, a list of parts, or null")
    if isinstance(content, list):
        media.check_parts(content, where)
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise InputError(f"{where}: only assistant messages may carry tool_calls")
        if not isinstance(calls, list):
            raise InputError(f"{where}: tool_calls must be a list")
        for index, call in enumerate(calls):
            _check_call(call, f"{where} tool_calls[{index}]")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InputError(f"{where}: a tool message needs a tool_call_id")
    _check_storable(message, where)
    return dict(message)


def _check_storable(message: Mapping[str, Any], where: str) -> None:
    """What both databases can hold: short names, text without NUL, finite numbers."""
    for key in ("tool_call_id", "name"):
        limits.check_name(message.get(key), f"{where}: {key}", optional=True)
    for key, value in message.items():
        limits.check_value(value, f"{where}: {key}")


def _check_call(call: Any, where: str) -> None:
    if not isinstance(call, Mapping) or not isinstance(call.get("id"), str) or not call["id"]:
        raise InputError(f"{where}: a tool call needs a string id")
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InputError(f"{where}: a tool call needs function.name")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        raise InputError(f"{where}: function.arguments must be a JSON string")


def check_tool_pairing(
    messages: Iterable[Mapping[str, Any]], where: str, open_calls: Iterable[str] = ()
) -> None:
    """Every tool message answers a call made by an earlier assistant message, once."""
    pending = set(open_calls)
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                pending.add(str(call["id"]))
        elif message.get("role") == "tool":
            call_id = str(message.get("tool_call_id"))
            if call_id not in pending:
                raise InputError(
                    f"{where} message {index}: tool result {call_id!r} answers no earlier call"
                )
            pending.discard(call_id)


def check_record(record: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """Every message of one imported conversation, checked, with its tool pairs checked."""
    messages = [check_message(m, f"{where} message {i}") for i, m in enumerate(record["messages"])]
    check_tool_pairing(messages, where)
    if record.get("id") is not None:
        limits.check_name(str(record["id"]), f"{where}: id")
    for key, value in record.items():
        if key not in ("id", "messages"):
            limits.check_value(value, f"{where}: {key}")
    return messages


def parse_json_line(line: str, where: str) -> dict[str, Any]:
    """One line of an import file: a JSON object with a ``messages`` list."""
    record = limits.loads(line, where)
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise InputError(f"{where}: expected an object with a 'messages' list")
    if "id" in record and not isinstance(record["id"], str | int):
        raise InputError(f"{where}: 'id' must be a string")
    return record
