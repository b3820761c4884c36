"""Seeded random JSON documents for comparing two parsers: valid ones of every shape, numbers
at the edges of 64 bits and of a double, strings with escapes and surrogates, nesting around
the bounded reader's depth limit, and mutations of them (bytes flipped, cut, inserted, a BOM)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable
from typing import Any

EDGE_NUMBERS = [
    "0",
    "-0",
    "-0.0",
    "1e0",
    "1E2",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999",
    "-99999999999999999999",
    "9" * 40,
    "1" + "0" * 400,
    "1e308",
    "1.7976931348623157e308",
    "1.7976931348623159e308",
    "1e309",
    "-1e400",
    "4.9e-324",
    "2e-324",
    "1e-400",
    "9.223372036854775807e18",
    "9223372036854775807.0",
    "0.1",
    "0.30000000000000004",
    "123456789.123456789e-5",
    "NaN",
    "Infinity",
    "-Infinity",
    "01",
    "1.",
    ".5",
    "+1",
]
EDGE_STRINGS = [
    '""',
    '"plain"',
    '"caf\\u00e9"',
    '"\\ud83d\\ude00"',
    '"\\ud800"',
    '"\\udc00"',
    '"\\ud800\\u0041"',
    '"\\ud800x"',
    '"a\\nb\\t\\"\\\\\\/"',
    '"\\x"',
    '"tab\there"',
    '"naïve 会话 🙂"',
]


def number(rng: random.Random) -> str:
    if rng.random() < 0.4:
        return rng.choice(EDGE_NUMBERS)
    kind = rng.randrange(4)
    if kind == 0:
        return str(rng.randint(-(2**70), 2**70))
    if kind == 1:
        return repr(rng.uniform(-1e20, 1e20))
    if kind == 2:
        return f"{rng.randint(1, 9)}.{rng.randint(0, 10**12)}e{rng.randint(-330, 330)}"
    return str(rng.randint(-1000, 1000))


def string(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(EDGE_STRINGS)
    letters = 'ab \\"é会🙂\n\x01'
    text = "".join(rng.choice(letters) for _ in range(rng.randrange(8)))
    return json.dumps(text, ensure_ascii=rng.random() < 0.5)


def quoted(rng: random.Random) -> str:
    """A key: any valid string (an object's keys are distinct, see the duplicate-key case)."""
    while True:
        text = string(rng)
        try:
            json.loads(text)
            return text
        except ValueError:
            continue


def value(rng: random.Random, depth: int) -> str:
    roll = rng.random()
    if depth < 70 and roll < 0.2:
        items = [value(rng, depth + 1) for _ in range(rng.randrange(4))]
        return "[" + ",".join(items) + "]"
    if depth < 70 and roll < 0.4:
        keys = {json.loads(quoted(rng)): None for _ in range(rng.randrange(4))}
        pairs = [f"{json.dumps(key)}:{value(rng, depth + 1)}" for key in keys]
        return "{" + ",".join(pairs) + "}"
    if roll < 0.45:
        nested = rng.randrange(55, 75)  # around the 64-level limit
        return "[" * nested + value(rng, 70) + "]" * nested
    if roll < 0.7:
        return number(rng)
    if roll < 0.9:
        return string(rng)
    return rng.choice(["true", "false", "null"])


def mutated(rng: random.Random, data: bytes) -> bytes:
    roll = rng.random()
    if roll < 0.5 or not data:
        return data
    at = rng.randrange(len(data))
    if roll < 0.65:
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    if roll < 0.8:
        return data[:at]
    if roll < 0.9:
        return data[:at] + rng.choice([b",", b"]", b"}", b'"', b"\\", b"\xff", b" "]) + data[at:]
    return "\ufeff".encode() + data


def same(left: Any, right: Any) -> bool:
    """Equal values of equal types all the way down (1 and 1.0 differ; -0.0 and 0.0 too; NaN
    equals NaN), walked without recursion: a document may nest deeper than the stack."""
    pending = [(left, right)]
    while pending:
        one, other = pending.pop()
        if type(one) is not type(other):
            return False
        if isinstance(one, dict):
            if list(one) != list(other):
                return False
            pending.extend((one[key], other[key]) for key in one)
        elif isinstance(one, list):
            if len(one) != len(other):
                return False
            pending.extend(zip(one, other, strict=True))
        elif isinstance(one, float):
            if math.isnan(one) or math.isnan(other):
                if not (math.isnan(one) and math.isnan(other)):
                    return False
            elif math.copysign(1, one) != math.copysign(1, other) or one != other:
                return False
        elif one != other:
            return False
    return True


def outcome(
    parse: Callable[[Any], Any],
    document: Any,
    refusals: type[BaseException] | tuple[type[BaseException], ...],
    detail: Callable[[BaseException], Any] = lambda exc: type(exc).__name__,
) -> tuple[str, Any]:
    """What ``parse`` answers for ``document``: ``("value", v)`` or ``("refused", detail)``."""
    try:
        return "value", parse(document)
    except refusals as exc:
        return "refused", detail(exc)


def assert_agree(
    fast: Callable[[Any], Any],
    reference: Callable[[Any], Any],
    documents: Iterable[Any],
    refusals: type[BaseException] | tuple[type[BaseException], ...],
    detail: Callable[[BaseException], Any] = lambda exc: type(exc).__name__,
) -> int:
    """Asserts that ``fast`` answers every document as ``reference`` does (the same value of the
    same types, or the same refusal); returns how many the reference refused."""
    refused = 0
    for case, document in enumerate(documents):
        mine = outcome(fast, document, refusals, detail)
        theirs = outcome(reference, document, refusals, detail)
        refused += theirs[0] == "refused"
        assert mine[0] == theirs[0] and same(mine[1], theirs[1]), (case, document[:200])
    return refused
