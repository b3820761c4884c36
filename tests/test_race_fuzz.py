"""The erasure race fuzz, a short seeded subset (``tests/support/race_fuzz.py``; the full run is
``bench/race.py``): add, assemble, compress on a real worker, delete, re-create, pin, recall and
retention interleaved at random on three ids of two owners, on SQLite and PostgreSQL. Nothing
of an erased conversation comes back, no owner reads the other's text, no message is lost, no
operation fails."""

from __future__ import annotations

from typing import Any

import pytest

from recap.workers.app import app
from recap.workers.errors import CompressionFailed
from tests.support import race_fuzz
from tests.support.slow import seeds
from tests.test_compress_worker import harness_for

pytestmark = pytest.mark.redis

SEEDS = (7, 1_234)  # the first by default, the second under -m slow (bench.race runs more)
RESULT_TIMEOUT = 120
SUMMARIZER_DELAY = 0.3  # seconds each summary takes: runs stay in flight across deletes


def enqueue(cid: str, force: bool) -> Any:
    return app.send_task("recap.compress_session", args=[cid], kwargs={"force": force})


def wait(result: Any) -> dict[str, Any]:
    value = result.get(timeout=RESULT_TIMEOUT, propagate=False)
    if result.state == "FAILURE":
        assert isinstance(value, CompressionFailed), value
        return {"action": "failed", "reason": str(value)}
    return dict(value)


@pytest.mark.parametrize("seed", seeds(SEEDS, fast=1))
def test_race_fuzz_resurrects_nothing(
    db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """A seeded run of 160 operations on four threads: every count is zero."""
    with harness_for(db_url, redis_url, monkeypatch) as h:
        h.server.default_delay = SUMMARIZER_DELAY
        figures = race_fuzz.run(
            h.engine, h.settings, enqueue, wait, seed=seed, operations=160, threads=4
        )
    text = race_fuzz.figures_text(figures)
    assert figures.runs > 0, text
    assert figures.resurrected_rows == 0, text
    assert figures.cross_tenant_reads == 0, text
    assert figures.lost_messages == 0, text
    assert figures.errors == 0, text
