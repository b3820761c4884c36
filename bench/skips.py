"""A ``compress_session`` run that skips, at 50 and at 5,000 stored messages.

A host enqueues a run after every turn, and most runs find nothing to do, so what a skip costs is
paid on nearly every turn. Two conversations built from the shared data live in one SQLite
database: 50 messages (under the trigger, never summarized) and 5,000 (compressed once by the
production run, with the offline summarizer, as a session that long would have been, so that
later runs skip). Each round runs ``workers.compress.compress_now`` in this process on each, the
production path of ``recap compress`` and ``Recap.compress``: the lease, the decision's reads,
the log row and the release. The figure is the ratio of the medians, in CPU time of this process
(the database runs in it).

PostgreSQL is reported too (wall time: the server works in another process) when a server
answers at ``RECAP_TEST_POSTGRES_URL``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from bench import Figure
from bench.add import on_both_databases
from bench.assemble import long_conversation

MODEL = "gpt-4o-mini"
SHORT, LONG = 50, 5_000  # the two conversation lengths compared
ROUNDS = 41  # rounds timed per conversation; the median of an odd count is one of them
WARMUP_ROUNDS = 3  # untimed first rounds: statement caches warm up
MAX_SETUP_RUNS = 4  # runs that bring the long conversation under its trigger
GROWTH_BOUND = "<= 1.5"  # a skip at 5,000 messages costs about what it costs at 50


def run() -> list[Figure]:
    return on_both_databases("skips", _measure)


def _measure(url: str, records: list[dict[str, Any]], suffix: str, folder: Path) -> list[Figure]:
    from recap.core import service
    from recap.core.settings import load_settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from recap.workers.compress import compress_now
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="WARNING", force=True)  # stdout is the JSON
    engine = make_engine(url)
    upgrade(engine)
    settings = load_settings(output_dir=folder / f"outputs{suffix}", summary_model=None)
    sizes = {f"short{suffix}": SHORT, f"long{suffix}": LONG}
    for cid, size in sizes.items():
        record = {"id": cid, "messages": long_conversation(records, size)}
        service.import_conversations(engine, [record], settings, model=MODEL)
        _settle(partial(compress_now, engine, settings, cid))
    clock = time.process_time if engine.dialect.name == "sqlite" else time.perf_counter
    times: dict[str, list[float]] = {cid: [] for cid in sizes}
    for _ in range(WARMUP_ROUNDS + ROUNDS):
        for cid in sizes:
            started = clock()
            result = compress_now(engine, settings, cid)
            times[cid].append(clock() - started)
            if result["action"] != "skipped":
                raise RuntimeError(f"bench.skips: a timed run did not skip: {result}")
    engine.dispose()
    short, long = (statistics.median(times[cid][WARMUP_ROUNDS:]) for cid in sizes)
    where = "PostgreSQL, wall time" if suffix else "SQLite, CPU time"
    return [
        Figure(
            f"skip_run_growth{suffix}",
            round(long / short, 2),
            GROWTH_BOUND if not suffix else "",
            f"median compress_now run that skips on a {LONG}-message conversation (summarized "
            f"once before) over the same on a {SHORT}-message one ({where}, {ROUNDS} rounds; "
            f"{long * 1e3:.2f} ms vs {short * 1e3:.2f} ms)",
        )
    ]


def _settle(compress: Callable[[], Mapping[str, Any]]) -> None:
    """Run until a run skips: the state every later turn's run starts from."""
    for _ in range(MAX_SETUP_RUNS):
        if compress()["action"] == "skipped":
            return
    raise RuntimeError("bench.skips: the conversation never settled under its trigger")
