"""What an OpenAI-format message may look like, as the providers accept it (pure: no storage, no
I/O, no media decoding). Every way in calls it: ``recap add`` and ``recap import``,
``Recap.add``/``add_many`` and the import (through ``core.request.validate.check_message``), and
``recap serve``, which can call ``check_shape`` and ``check_numbers`` on what a client sends.

The rules:

- ``role`` is one of ``ROLES``.
- ``content`` is a string, or a non-empty list of content parts, each an object whose ``type`` is
  one of ``PART_TYPES`` (a ``text`` part carries a string ``text``, a ``refusal`` part a string
  ``refusal``; media parts are checked further by ``core.counting.media``).
- ``content`` may be null or absent only where the provider allows it: an assistant message that
  carries something else to say (tool calls, a legacy ``function_call``, ``audio`` or a
  ``refusal``).
- ``id``, when given, is a string, or an integer (``recap export`` writes the stored row id);
  never a boolean or anything else. It is not stored: the row's own id replaces it.
- Every number anywhere in the message is finite (NaN and infinity are not JSON).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from recap.core.errors import InputError
from recap.core.values.records import ROLES as ROLES  # one list of the roles a message may have

TEXT_PART = "text"
REFUSAL_PART = "refusal"
MEDIA_PARTS = ("image_url", "input_audio", "file")  # core.counting.media.PART_KINDS
THINKING_PARTS = ("thinking", "redacted_thinking")  # core.counting.reasoning.THINKING_TYPES
PART_TYPES = (TEXT_PART, *MEDIA_PARTS, REFUSAL_PART, *THINKING_PARTS)
# Fields besides content that give an assistant message something to say, so its content may be
# null (OpenAI: "required unless tool_calls or function_call is specified"; audio and refusal
# replies come back with null content too).
CONTENT_STAND_INS = ("tool_calls", "function_call", "audio", "refusal")
MAX_DEPTH = 64  # as core.values.limits.JSON_MAX_DEPTH: far deeper than any chat message


def check_shape(message: Mapping[str, Any], where: str) -> None:
    """The message's role, content and id as providers accept them, and finite numbers
    throughout; an ``InputError`` naming ``where`` and the first problem otherwise."""
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InputError(f"{where}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
    check_content(message, where)
    check_message_id(message.get("id"), f"{where}: id")
    check_numbers(message, where)


def check_content(message: Mapping[str, Any], where: str) -> None:
    """A string, a non-empty list of known parts, or null where an assistant message allows it."""
    content = message.get("content")
    if content is None:
        if message.get("role") == "assistant" and any(
            message.get(key) for key in CONTENT_STAND_INS
        ):
            return
        raise InputError(
            f"{where}: content is missing; only an assistant message with tool calls may have "
            "null content"
        )
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InputError(
            f"{where}: content must be a string or a list of parts, not {_json_type(content)}"
        )
    if not content:
        raise InputError(f"{where}: content is an empty list of parts")
    check_parts(content, where)


def check_parts(parts: Sequence[Any], where: str) -> None:
    """Each part an object of a known ``type``; text and refusal parts carry their string."""
    for index, part in enumerate(parts):
        label = f"{where} part {index}"
        if not isinstance(part, Mapping):
            raise InputError(f"{label}: a content part must be an object, not {_json_type(part)}")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise InputError(f"{label}: a content part needs a string type")
        if kind not in PART_TYPES:
            raise InputError(
                f"{label}: unknown content part type {kind!r} (expected one of "
                f"{', '.join(PART_TYPES)})"
            )
        if kind in (TEXT_PART, REFUSAL_PART) and not isinstance(part.get(kind), str):
            raise InputError(f"{label}: a {kind} part needs a string {kind!r}")


def check_message_id(value: Any, label: str) -> None:
    """A message's own ``id``: absent, a string, or an integer (never a boolean)."""
    if value is None or isinstance(value, str):
        return
    if isinstance(value, int) and not isinstance(value, bool):
        return
    raise InputError(f"{label} must be a string, not {_json_type(value)}")


def check_conversation_id(value: Any, label: str) -> None:
    """A conversation id given in input: absent (a UUID is made) or a string."""
    if value is not None and not isinstance(value, str):
        raise InputError(f"{label} must be a string, not {_json_type(value)}")


def check_numbers(value: Any, where: str) -> None:
    """Every number in a JSON-shaped value is finite: NaN and infinity are not JSON, and a
    provider answers them with an error, or never parses them. Walks iteratively: any depth is
    safe."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InputError(f"{where}: {item} is not a finite number")
        children = item.values() if isinstance(item, Mapping) else item
        if isinstance(item, Mapping | list | tuple):
            if depth >= MAX_DEPTH:
                raise InputError(f"{where} is nested deeper than {MAX_DEPTH} levels")
            pending.extend((child, depth + 1) for child in children)


def _json_type(value: Any) -> str:
    """The JSON name of a value's type, as an error names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"
