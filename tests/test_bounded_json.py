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
from typing import Any

import pytest

from tests.support.json_documents import mutated, same, value
from workers.serve import bounded

CASES = int(os.environ.get("RECAP_FUZZ_CASES", "6000"))
SEEDS = (1, 2, 3)


def _outcome(parse: Any, data: bytes | str) -> tuple[str, Any]:
    try:
        return "value", parse(data)
    except bounded.Unreadable as exc:
        return "refused", str(exc)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_fast_path_answers_as_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    refused = 0
    for case in range(CASES // len(SEEDS)):
        data = mutated(rng, value(rng, 0).encode())
        source: bytes | str = data
        if rng.random() < 0.1:  # text, as a caller that decoded it already passes it
            source = data.decode("utf-8", "replace")
        fast, reference = _outcome(bounded.loads, source), _outcome(bounded.reference_loads, source)
        refused += reference[0] == "refused"
        assert fast[0] == reference[0] and same(fast[1], reference[1]), (case, data[:200])
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
        assert fast[0] == reference[0] and same(fast[1], reference[1])


def test_a_value_a_repeated_key_replaces_is_not_judged_by_the_fast_path() -> None:
    text = b'{"n":' + b"9" * 30 + b',"n":1}'
    assert bounded.loads(text) == {"n": 1}
    with pytest.raises(bounded.Unreadable):
        bounded.reference_loads(text)
