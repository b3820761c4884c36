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

import os
import random
from collections.abc import Iterable, Iterator

import pytest

from tests.support.json_documents import assert_agree, mutated, value
from recap.workers.serve import bounded

CASES = int(os.environ.get("RECAP_FUZZ_CASES", "6000"))
SEEDS = (1, 2, 3)


def _sources(rng: random.Random) -> Iterator[bytes | str]:
    """Documents and mutations as bytes, a tenth as text (as a caller that decoded it passes)."""
    for _ in range(CASES // len(SEEDS)):
        data = mutated(rng, value(rng, 0).encode())
        yield data.decode("utf-8", "replace") if rng.random() < 0.1 else data


def _agree(sources: Iterable[bytes | str]) -> int:
    return assert_agree(
        bounded.loads, bounded.reference_loads, sources, bounded.Unreadable, detail=str
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_the_fast_path_answers_as_the_reference(seed: int) -> None:
    refused = _agree(_sources(random.Random(seed)))
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
    _agree([text, text.encode()])


def test_a_value_a_repeated_key_replaces_is_not_judged_by_the_fast_path() -> None:
    text = b'{"n":' + b"9" * 30 + b',"n":1}'
    assert bounded.loads(text) == {"n": 1}
    with pytest.raises(bounded.Unreadable):
        bounded.reference_loads(text)
