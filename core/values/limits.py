"""What both databases can store, checked before anything is written (pure, no SQLAlchemy).

Recap runs on SQLite and PostgreSQL, and an input is accepted or refused the same way on both:
the narrower of the two decides. The integer bounds are those of the columns in
``core.storage.models`` (a test checks that they agree), so a number the CLI or a host passes never
overflows a column.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from recap.core.errors import InputError

INT32_MAX = 2**31 - 1  # PostgreSQL INTEGER: token counts, windows, sizes
INT64_MAX = 2**63 - 1  # PostgreSQL BIGINT and SQLite INTEGER: message and row ids
MESSAGE_ID_MAX = INT64_MAX
TOKENS_MAX = INT32_MAX
NAME_MAX_CHARS = 255  # VARCHAR(255): conversation ids, models, tool call ids, tool names
# Far deeper than any chat message (about six levels); Python's own recursion limit (about
# 1,000 frames) is what a deeper document would hit in the parser or the JSON encoder.
JSON_MAX_DEPTH = 64

NUL = "\x00"


def check_int(value: int, label: str, *, low: int, high: int) -> int:
    """``value`` itself, or an ``InputError`` when it lies outside ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{label} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InputError(f"{label} must be between {low} and {high}, got {value}")
    return value


def check_message_id(value: int | None, label: str) -> int | None:
    """A message id (``--parent``, ``--leaf``): positive, within a 64-bit column."""
    return None if value is None else check_int(value, label, low=1, high=MESSAGE_ID_MAX)


def check_window(value: int | None, label: str) -> int | None:
    """A window override: positive, within PostgreSQL's 32-bit INTEGER column."""
    return None if value is None else check_int(value, label, low=1, high=TOKENS_MAX)


def check_name(value: Any, label: str, *, optional: bool = False) -> None:
    """A string stored in a VARCHAR(255) column: at most 255 characters, storable text."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise InputError(f"{label} must be a string, got {type(value).__name__}")
    if len(value) > NAME_MAX_CHARS:
        raise InputError(f"{label} is {len(value)} characters long; the limit is {NAME_MAX_CHARS}")
    _check_text(value, label)


def check_value(value: Any, label: str) -> None:
    """A JSON-shaped value (a message, its parts, a record's extra fields): storable on both
    databases. Strings hold no NUL character (PostgreSQL text cannot) and no lone surrogate
    (not UTF-8), numbers are finite (PostgreSQL's JSON has no NaN), keys are strings, and the
    nesting is at most ``JSON_MAX_DEPTH`` levels. Walks iteratively: any depth is safe."""
    pending: list[tuple[Any, str, int]] = [(value, label, 0)]
    while pending:
        item, where, depth = pending.pop()
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InputError(f"{where} is {item}; only finite numbers can be stored")
        elif isinstance(item, Mapping | list | tuple):
            if depth >= JSON_MAX_DEPTH:
                raise InputError(f"{where} is nested deeper than {JSON_MAX_DEPTH} levels")
            pending.extend(_children(item, where, depth + 1))
        else:
            raise InputError(f"{where} is a {type(item).__name__}, not a JSON value")


def _children(item: Any, where: str, depth: int) -> list[tuple[Any, str, int]]:
    if isinstance(item, Mapping):
        for key in item:
            if not isinstance(key, str):
                raise InputError(f"{where} has a non-string key {key!r}")
            _check_text(key, f"{where} key")
        return [(child, f"{where}.{key}", depth) for key, child in item.items()]
    return [(child, f"{where}[{index}]", depth) for index, child in enumerate(item)]


def _check_text(text: str, where: str) -> None:
    if NUL in text:
        raise InputError(
            f"{where} contains a NUL character (U+0000), which PostgreSQL cannot store"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{where} contains a lone surrogate (not valid Unicode)") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str, where: str) -> Any:
    """Parse JSON input, or an ``InputError`` naming ``where``: malformed text, ``NaN`` and
    ``Infinity`` (not JSON), and nesting deeper than the parser can follow."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{where}: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested deeper than {JSON_MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from None


def check_conversation(conversation_id: str, model: str, max_input_tokens: int | None) -> None:
    """The columns of a new conversation row: its id, its model and its window override."""
    check_name(conversation_id, "conversation id")
    check_name(model, "model")
    check_window(max_input_tokens, "max_input_tokens")
