"""The live-loop fuzz, a seeded subset (``tests/support/livefuzz.py``; the full run is
``bench fuzz``).

Random host sessions assemble, call a provider that counts 0.6-1.6x tiktoken, record its reading
after some requests and add the reply: no request goes over the window by the provider's count
once it was read, no dead end where the fixed parts and the last user message fit, nothing is
left out unreported, and the calibration learns the provider's ratio.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import livefuzz
from tests.support.slow import SLOW

# Seeds 0-11 by default (a few seconds; they draw chat and replayed sessions, truncations and
# compressions); seeds 12-23 under ``-m slow``; ``bench fuzz`` runs thousands.
FAST, REST = range(12), range(12, 24)


@pytest.fixture(
    scope="module",
    params=[pytest.param(FAST, id="fast"), pytest.param(REST, id="rest", marks=SLOW)],
)
def seeds(request: pytest.FixtureRequest) -> range:
    seeds: range = request.param
    return seeds


@pytest.fixture(scope="module")
def figures(seeds: range, tmp_path_factory: pytest.TempPathFactory) -> livefuzz.Figures:
    return livefuzz.run(tmp_path_factory.mktemp("fuzz"), seeds)


def test_the_sessions_ran(figures: livefuzz.Figures, seeds: range) -> None:
    """The subset did real work: requests, readings, truncations and compressions."""
    assert figures.sessions == len(seeds)
    assert figures.requests > 10 * len(seeds) and figures.readings > 0
    assert figures.compressions > 0 and figures.truncated_requests > 0


@pytest.mark.parametrize(
    "name", ["over_window", "dead_ends", "silent_truncations"], ids=lambda n: n
)
def test_no_failure_of_the_class(figures: livefuzz.Figures, name: str) -> None:
    """None of the failures the fuzz counts happened (the first ones are shown when they do)."""
    assert getattr(figures, name) == 0, "\n".join(figures.failures[:10])


def test_calibration_learns_the_provider(figures: livefuzz.Figures) -> None:
    """After three readings the factor is within 0.05 of the provider's ratio (median)."""
    assert figures.calibration_errors
    assert figures.calibration_error <= 0.05


def test_a_truncated_reading_does_not_overflow_the_next_request(tmp_path: Path) -> None:
    """The "why" case: a reading of a truncated request, exactly what was sent, keeps the
    factor at 1 instead of comparing it with the whole stored history."""
    from recap.core.client import Recap
    from recap.core.settings import Settings

    recap = Recap(
        Settings(database_url=f"sqlite:///{tmp_path / 'r.db'}", output_dir=tmp_path / "o"),
        create_schema=True,
    )
    cid = recap.new(model="gpt-4o", max_input_tokens=4_000)
    for turn in range(40):
        recap.add(cid, {"role": "user", "content": f"question {turn} " + "word " * 120})
        recap.add(cid, {"role": "assistant", "content": f"answer {turn} " + "word " * 120})
    recap.add(cid, {"role": "user", "content": "and now?"})
    first = recap.assemble(cid)
    assert first.truncated
    usage = recap.record_usage(cid, prompt_tokens=first.tokens.total)
    assert usage.calibration == 1.0 and usage.estimated == first.tokens.total
    assert recap.stats(cid)["basis"] == "measured"
    second = recap.assemble(cid)
    assert second.tokens.total <= 4_000 * 0.95
