"""Reusing the last request's read of a conversation (``core.storage.reuse``): right, and worth it.

- ``reuse_mismatches``: seeded random histories (``tests/test_assembly_reuse.py``: turns, tool
  calls, forks, leaves anywhere, summaries, clearings, output reserves, provider readings, model
  changes and recounts, requests that write back, the conversation made again), ``SEEDS`` of
  them here against the suite's few: the steps after which the request assembled from the reused
  read differs from the one a fresh read gives, or the reads themselves differ. Must be 0.
- ``assemble_new_turn_reused_vs_fresh``: ``assemble`` of a new turn of a 200-message
  conversation (one user message added after the stored reply) starting from the last turn's
  read, over the same request read afresh; medians of alternating rounds, on SQLite.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench import Figure
from bench.assemble import long_conversation
from bench.data import load_all

SEEDS = 60  # random histories (the suite runs 8)
CONVERSATION = 200  # messages of the timed conversation
ROUNDS = 41  # timed rounds, alternating the two


def run() -> list[Figure]:
    from recap.core.settings import Settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.test_assembly_reuse import compare_history

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        settings = Settings(database_url=f"sqlite:///{root / 'reuse.db'}", output_dir=root / "out")
        engine = make_engine(settings.database_url)
        upgrade(engine)
        differences: list[str] = []
        for seed in range(SEEDS):
            found, _ = compare_history(engine, settings, 10_000 + seed)
            differences += found
        ratio, reused_ms, fresh_ms = _timed(engine, settings)
        engine.dispose()
    for line in differences[:5]:
        print(f"bench.reuse: {line}")
    return [
        Figure(
            "reuse_mismatches",
            len(differences),
            "== 0",
            f"steps of {SEEDS} seeded random histories after which the request from the reused "
            "read differs from the fresh one (or the reads do)",
        ),
        Figure(
            "assemble_new_turn_reused_vs_fresh",
            round(ratio, 3),
            "",
            f"assemble of a new turn of a {CONVERSATION}-message conversation from the last "
            f"turn's read ({reused_ms:.2f} ms) over reading it afresh ({fresh_ms:.2f} ms); "
            "SQLite, medians of alternating rounds",
        ),
    ]


def _timed(engine: object, settings: object) -> tuple[float, float, float]:
    from sqlalchemy import Engine

    from recap.core import service
    from recap.core.settings import Settings
    from recap.core.storage.reuse import BranchReuse

    assert isinstance(engine, Engine) and isinstance(settings, Settings)
    cid = service.new_conversation(engine, settings, "timed", model="gpt-4o")
    history = long_conversation(load_all(), CONVERSATION)
    service.add_many(engine, cid, history)
    reuse = BranchReuse()
    service.assemble(engine, cid, settings, reuse=reuse)
    reused: list[float] = []
    fresh: list[float] = []
    for n in range(ROUNDS):
        service.add_message(engine, cid, {"role": "user", "content": f"next step {n}"})
        sides = [(reuse, reused), (None, fresh)]
        for given, times in sides if n % 2 else sides[::-1]:
            started = time.perf_counter()
            service.assemble(engine, cid, settings, reuse=given, record=False)
            times.append(time.perf_counter() - started)
        service.add_message(engine, cid, {"role": "assistant", "content": f"done {n}"})
    reused_ms, fresh_ms = statistics.median(reused) * 1000, statistics.median(fresh) * 1000
    return reused_ms / fresh_ms, reused_ms, fresh_ms
