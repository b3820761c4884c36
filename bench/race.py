"""The erasure race fuzz, full run (``tests/support/race_fuzz.py``; the suite runs two short
seeds in ``tests/test_race_fuzz.py``).

Seeded random interleavings of add, assemble, compress on a real Celery worker (threads pool,
Redis broker, a summarizer taking ``SUMMARIZER_DELAY`` s so runs stay in flight across deletes),
delete, re-create, pin, recall and retention, on four conversation ids shared by two owners, on
SQLite and on PostgreSQL. Every count must be zero: rows of an erased conversation found in
(or naming messages outside) the conversation now under its id, text of one owner read by the
other, messages missing that an add reported stored, operations or runs that raised or failed.
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Any

import pytest

from bench import Figure
from tests.support import race_fuzz
from tests.support.services import SUITE, postgres_database

SEEDS = (101, 202, 303)
IDS = 4
OPERATIONS = 600  # per seed and database
THREADS = 6
SUMMARIZER_DELAY = 0.5


def _one(db_url: str, redis_url: str, seed: int) -> race_fuzz.Figures:
    """One seeded run on its own worker, settings and output folder."""
    worker = importlib.import_module("tests.test_compress_worker")  # the suite's own harness
    suite = importlib.import_module("tests.test_race_fuzz")
    harness_for, enqueue, wait = worker.harness_for, suite.enqueue, suite.wait
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setenv("RECAP_OUTPUT_DIR", str(Path(tmp) / "outputs"))
        with harness_for(db_url, redis_url, patch) as h:
            h.server.default_delay = SUMMARIZER_DELAY
            return race_fuzz.run(
                h.engine,
                h.settings,
                enqueue,
                wait,
                seed=seed,
                ids=IDS,
                operations=OPERATIONS,
                threads=THREADS,
            )


COUNTS = ("operations", "runs", "resurrected_rows", "cross_tenant_reads", "lost_messages", "errors")


def _add(total: race_fuzz.Figures, part: race_fuzz.Figures) -> None:
    for name in COUNTS:
        setattr(total, name, getattr(total, name) + getattr(part, name))
    total.failures.extend(part.failures)


def run(data: list[Path] | None = None) -> list[Figure]:
    redis_url = SUITE.redis_url()
    total = race_fuzz.Figures()
    try:
        for seed in SEEDS:
            with tempfile.TemporaryDirectory() as tmp:
                _add(total, _one(f"sqlite:///{Path(tmp) / 'race.db'}", redis_url, seed))
            with postgres_database(SUITE.postgres_admin_url()) as url:
                _add(total, _one(url, redis_url, seed))
    finally:
        SUITE.stop()
    for line in total.failures[:20]:
        print(line, flush=True)
    where = (
        f"{len(SEEDS)} seeds x SQLite and PostgreSQL, {total.operations} operations, "
        f"{total.runs} worker runs, {IDS} ids, two owners"
    )
    figures: list[tuple[str, Any, str]] = [
        ("race_resurrected_rows", total.resurrected_rows, "rows or text of an erased generation"),
        ("race_cross_tenant_reads", total.cross_tenant_reads, "one owner's text read by the other"),
        ("race_lost_messages", total.lost_messages, "stored messages missing at the end"),
        ("race_500s", total.errors, "operations that raised and runs that failed"),
    ]
    return [Figure(name, value, "== 0", f"{what} ({where})") for name, value, what in figures]
