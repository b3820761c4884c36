"""Stored JSON columns are decoded by orjson where it gives ``json.loads``'s value.

``reads.stored_json`` decodes the tool calls, parts and extra fields of every row a request
reads. Seeded random documents (every JSON shape, integers past 64 bits, doubles at their
edges, ``NaN`` and ``Infinity`` as ``json.dumps`` writes them, escapes and lone surrogates), as
``json.dumps`` stores them and mutated, must decode to the same value of the same types as
``json.loads`` gives, or fail as it fails. The full run is ``RECAP_FUZZ_CASES=200000 pytest
tests/test_stored_json.py``.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from recap.core.storage.reads import stored_json
from tests.support.json_documents import assert_agree, mutated, same, value

CASES = int(os.environ.get("RECAP_FUZZ_CASES", "6000"))
SEEDS = (4, 5, 6)


def _stored(rng: random.Random) -> str:
    """A document as a column holds it: written by ``json.dumps`` (either escaping), or as it
    came, mutated."""
    text = mutated(rng, value(rng, 0).encode()).decode("utf-8", "replace")
    if rng.random() < 0.6:
        try:
            return json.dumps(json.loads(text), ensure_ascii=rng.random() < 0.5)
        except (ValueError, RecursionError):
            pass
    return text


@pytest.mark.parametrize("seed", SEEDS)
def test_stored_json_decodes_as_json_loads(seed: int) -> None:
    rng = random.Random(seed)
    texts = (_stored(rng) for _ in range(CASES // len(SEEDS)))
    errors = assert_agree(stored_json, json.loads, texts, (ValueError, RecursionError))
    assert 0 < errors < CASES // len(SEEDS)  # both kinds of answer were met


@pytest.mark.parametrize(
    "text",
    [
        '{"n": 9223372036854775807}',
        '{"n": -9223372036854775809}',
        '{"n": 18446744073709551616}',
        "[1e400, -1e400]",
        "[NaN, Infinity, -Infinity]",
        '"\\ud800"',
        '{"s": "caf\\u00e9 \\ud83d\\ude00"}',
        '{"id": "call_1234567890123456789012"}',
        '{"a": 1, "a": 2}',
    ],
)
def test_edge_columns_decode_as_json_loads(text: str) -> None:
    assert same(stored_json(text), json.loads(text))
