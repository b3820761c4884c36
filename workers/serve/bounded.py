"""Bounded JSON: numbers checked as the parser meets them, depth and Unicode checked after.

Any JSON that reaches Recap from outside (a request body, an upstream's reply) is parsed here:
an integer of more than ``MAX_INT_CHARS`` characters is refused before Python converts it (no
5,000-digit number reaches ``int``), integers stay within 64 bits, floats are finite, ``NaN`` and
``Infinity`` are refused (not JSON), and the result is walked without recursion: at most
``MAX_DEPTH`` levels, no lone surrogate in any string or key. A document too deep for the parser
itself is refused the same way. Every failure is one ``Unreadable`` saying why.

Two parsers give one answer. orjson reads a document first (a 185 KB request in about a quarter
of the stdlib's time); what it returns is kept only when a walk finds every rule held (depth,
integers within 64 bits, no float as large as an integer past 64 bits could have become:
orjson turns such an integer into a float). Anything else, and anything orjson refuses, is
decided by the stdlib parser with the checks above (``reference_loads``), which also words every
refusal. A seeded test holds the two equal over valid, hostile and mutated documents.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

from recap.core.values.limits import JSON_MAX_DEPTH

MAX_DEPTH = JSON_MAX_DEPTH  # far deeper than any request or reply (about six levels)
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # no parameter or count takes a wider integer
MAX_INT_CHARS = 20  # a sign and 19 digits hold every 64-bit integer


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # the escape of a UTF-16 surrogate


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
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return reference_loads(data)  # refused (or a BOM): the reference decides and words it
    # the value as the one child of a list one level up: scalars and containers walked alike
    return value if _plain([value], -1) else reference_loads(data)


def reference_loads(data: bytes | str) -> Any:
    """``loads`` by the stdlib parser alone, every rule checked as it parses: the reference
    the fast path is held to, and the wording of every refusal."""
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
    # strict UTF-8 holds no surrogate: only a \\uD800-style escape can make a lone one
    check_tree(value, strings=SURROGATE_ESCAPE.search(data) is not None)
    return value


# a float at least this large may be an integer of more than 64 bits that orjson made a float
FLOAT_DOUBT = float(2**63)


def _plain(item: dict[str, Any] | list[Any], depth: int) -> bool:
    """Whether orjson's ``item`` needs no second look: within ``MAX_DEPTH`` levels, its
    integers within 64 bits, no float of an integer's doubtful size (strings are valid Unicode
    already: orjson refuses a lone surrogate)."""
    if depth >= MAX_DEPTH:
        return False
    children: Any = item.values() if isinstance(item, dict) else item
    for child in children:
        if isinstance(child, str):
            continue
        if isinstance(child, dict | list):
            if not _plain(child, depth + 1):
                return False
        elif isinstance(child, float):
            if not -FLOAT_DOUBT < child < FLOAT_DOUBT:
                return False
        elif isinstance(child, int) and not INT_MIN <= child <= INT_MAX:
            return False
    return True


def check_tree(value: Any, *, strings: bool = True) -> None:
    """At most ``MAX_DEPTH`` levels and (with ``strings``) valid Unicode in every string and
    key. Recursive, but the depth is checked before each step down: never more than
    ``MAX_DEPTH`` frames."""
    if isinstance(value, str):
        if strings:
            _check_text(value)
    elif isinstance(value, dict | list):
        _walk(value, 0, strings)


def _walk(item: dict[str, Any] | list[Any], depth: int, strings: bool) -> None:
    if depth >= MAX_DEPTH:
        raise Unreadable(f"nested deeper than {MAX_DEPTH} levels")
    if type(item) is dict:
        if strings:
            for key in item:
                _check_text(key)
        children: Any = item.values()
    else:
        children = item
    for child in children:
        kind = type(child)
        if kind is dict or kind is list:
            _walk(child, depth + 1, strings)
        elif strings and kind is str:
            _check_text(child)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Unreadable("a string holds a lone surrogate (not valid Unicode)") from None
