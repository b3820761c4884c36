"""Bounded JSON: numbers checked as the parser meets them, depth and Unicode checked after.

Any JSON that reaches Recap from outside (a request body, an upstream's reply) is parsed here:
an integer of more than ``MAX_INT_CHARS`` characters is refused before Python converts it (no
5,000-digit number reaches ``int``), integers stay within 64 bits, floats are finite, ``NaN`` and
``Infinity`` are refused (not JSON), and the result is walked without recursion: at most
``MAX_DEPTH`` levels, no lone surrogate in any string or key. A document too deep for the parser
itself is refused the same way. Every failure is one ``Unreadable`` saying why.
"""

from __future__ import annotations

import json
import math
from typing import Any

from core.storage.limits import JSON_MAX_DEPTH

MAX_DEPTH = JSON_MAX_DEPTH  # far deeper than any request or reply (about six levels)
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # no parameter or count takes a wider integer
MAX_INT_CHARS = 20  # a sign and 19 digits hold every 64-bit integer


class Unreadable(ValueError):
    """JSON Recap does not read, and why."""


def _parse_int(text: str) -> int:
    if len(text) > MAX_INT_CHARS:
        raise Unreadable(f"an integer of {len(text)} digits is larger than any field takes")
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise Unreadable(f"the integer {text} does not fit in 64 bits")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Unreadable(f"the number {text[:40]} is too large for a double")
    return value


def _parse_constant(name: str) -> Any:
    raise Unreadable(f"{name} is not valid JSON (only finite numbers are)")


_DECODER = json.JSONDecoder(
    parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
)


def loads(data: bytes | str) -> Any:
    """The JSON value of ``data`` (UTF-8 bytes or text), bounded; ``Unreadable`` otherwise."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Unreadable(f"not valid UTF-8 (at byte {exc.start})") from None
    try:
        value = _DECODER.decode(data.removeprefix("\ufeff"))
    except Unreadable:
        raise
    except json.JSONDecodeError as exc:
        raise Unreadable(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise Unreadable(f"nested deeper than {MAX_DEPTH} levels") from None
    check_tree(value)
    return value


def check_tree(value: Any) -> None:
    """At most ``MAX_DEPTH`` levels and valid Unicode everywhere, walked without recursion."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise Unreadable(f"nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key in item:
                    _check_text(key)
                pending.extend((child, depth + 1) for child in item.values())
            else:
                pending.extend((child, depth + 1) for child in item)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Unreadable("a string holds a lone surrogate (not valid Unicode)") from None
