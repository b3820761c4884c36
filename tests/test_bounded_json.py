"""The bounded JSON reader's two parsers give one answer.

``bounded.loads`` keeps what orjson reads when every rule holds, and hands anything else to the
stdlib parser with its checks (``bounded.reference_loads``). Seeded random documents (valid ones
of every JSON shape, numbers at the edges of 64 bits and of a double, strings with escapes and
surrogates) and mutations of them (bytes flipped, cut, inserted, a BOM) must get the same value
of the same types, or the same refusal, from both. The suite runs a fast seeded subset; the full
run is ``RECAP_FUZZ_CASES=200000 pytest tests/test_bounded_json.py``.

One difference is chosen: when a key repeats, both parsers keep the last value, but only the
reference judges the values it replaces (an integer past 64 bits there is refused by the
reference and never seen by the fast path). Such a value reaches no field, so the fast path's
answer stands; the case is pinned below.
"""

from __future__ import annotations

import json
import math
import os
import random
from typing import Any

import pytest

from workers.serve import bounded

CASES = int(os.environ.get("RECAP_FUZZ_CASES", "6000"))
SEEDS = (1, 2, 3)

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


def _number(rng: random.Random) -> str:
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


def _string(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(EDGE_STRINGS)
    letters = 'ab \\"é会🙂\n\x01'
    text = "".join(rng.choice(letters) for _ in range(rng.randrange(8)))
    return json.dumps(text, ensure_ascii=rng.random() < 0.5)


def _quoted(rng: random.Random) -> str:
    """A key: any valid string (an object's keys are distinct, see the duplicate-key case)."""
    while True:
        text = _string(rng)
        try:
            json.loads(text)
            return text
        except ValueError:
            continue


def _value(rng: random.Random, depth: int) -> str:
    roll = rng.random()
    if depth < 70 and roll < 0.2:
        items = [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
        return "[" + ",".join(items) + "]"
    if depth < 70 and roll < 0.4:
        keys = {json.loads(_quoted(rng)): None for _ in range(rng.randrange(4))}
        pairs = [f"{json.dumps(key)}:{_value(rng, depth + 1)}" for key in keys]
        return "{" + ",".join(pairs) + "}"
    if roll < 0.45:
        nested = rng.randrange(55, 75)  # around the 64-level limit
        return "[" * nested + _value(rng, 70) + "]" * nested
    if roll < 0.7:
        return _number(rng)
    if roll < 0.9:
        return _string(rng)
    return rng.choice(["true", "false", "null"])


def _mutated(rng: random.Random, data: bytes) -> bytes:
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


def _outcome(parse: Any, data: bytes | str) -> tuple[str, Any]:
    try:
        return "value", parse(data)
    except bounded.Unreadable as exc:
        return "refused", str(exc)


def _same(left: Any, right: Any) -> bool:
    """Equal values of equal types all the way down (1 and 1.0 differ; -0.0 and 0.0 too)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return list(left) == list(right) and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(_same, left, right))
    if isinstance(left, float):
        return math.copysign(1, left) == math.copysign(1, right) and left == right
    return bool(left == right)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_fast_path_answers_as_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    refused = 0
    for case in range(CASES // len(SEEDS)):
        data = _mutated(rng, _value(rng, 0).encode())
        source: bytes | str = data
        if rng.random() < 0.1:  # text, as a caller that decoded it already passes it
            source = data.decode("utf-8", "replace")
        fast, reference = _outcome(bounded.loads, source), _outcome(bounded.reference_loads, source)
        refused += reference[0] == "refused"
        assert fast[0] == reference[0] and _same(fast[1], reference[1]), (case, data[:200])
    assert 0 < refused < CASES // len(SEEDS)  # both kinds of answer were met


@pytest.mark.parametrize(
    "text",
    [
        '{"n":9223372036854775807}',
        '{"n":9223372036854775808}',
        '{"n":18446744073709551616}',
        '{"f":9.3e18}',
        '{"f":1e300}',
        '{"s":"\\ud83d\\ude00"}',
        "\ufeff{}",
        "[" * 64 + "]" * 64,
        "[" * 65 + "]" * 65,
    ],
)
def test_edge_documents_answer_as_the_reference(text: str) -> None:
    for source in (text, text.encode()):
        fast, reference = _outcome(bounded.loads, source), _outcome(bounded.reference_loads, source)
        assert fast[0] == reference[0] and _same(fast[1], reference[1])


def test_a_value_a_repeated_key_replaces_is_not_judged_by_the_fast_path() -> None:
    text = b'{"n":' + b"9" * 30 + b',"n":1}'
    assert bounded.loads(text) == {"n": 1}
    with pytest.raises(bounded.Unreadable):
        bounded.reference_loads(text)
