"""The idle sweep against the cheapest possible write: one raw SQL insert of the same rows.

1,000 idle agent conversations of 103 tool results each are stored in SQLite; the sweep (batches
of ``RECAP_SWEEP_BATCH_SIZE``, each one ``INSERT ... SELECT`` that also decides eligibility and
the tokens reclaimed over a window of results) clears the 100,000 results older than each
conversation's last three. The
baseline writes the same 100,000 clearing rows with one ``INSERT ... SELECT`` over a table of
their ids, deciding nothing.
"""

from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, text

from bench import Figure
from recap.core.settings import load_settings
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import utcnow
from recap.core.storage.sweep import sweep_idle

CONVERSATIONS = 1_000
RESULTS_PER_CONVERSATION = 103  # the last 3 are kept: 100 cleared per conversation
REPEATS = 5  # best of five, interleaved: the least disturbed run of each side
OUTPUT = "collected 12 items; test_api.py::test_retry FAILED (AssertionError: 429 != 200)\n" * 3


def populate(engine: Engine) -> None:
    """Idle conversations, each a user turn and then call/result pairs, written in bulk."""
    stamp = (utcnow() - timedelta(hours=3)).isoformat(sep=" ")
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.executemany(
            "INSERT INTO conversations (id, model, created_at, last_activity_at, dirty) "
            "VALUES (?, 'gpt-4o-mini', ?, ?, 0)",
            [(f"conv-{c}", stamp, stamp) for c in range(CONVERSATIONS)],
        )
        rows: list[tuple[object, ...]] = []
        next_id = 1
        for c in range(CONVERSATIONS):
            parent = None
            for i in range(RESULTS_PER_CONVERSATION):
                call = f"call_{c}_{i}"
                calls = (
                    f'[{{"id": "{call}", "type": "function", '
                    f'"function": {{"name": "bash", "arguments": "{{}}"}}}}]'
                )
                rows.append(
                    (next_id, f"conv-{c}", parent, "assistant", None, calls, None, None, 30)
                )
                rows.append(
                    (next_id + 1, f"conv-{c}", next_id, "tool", OUTPUT, None, call, "bash", 600)
                )
                parent, next_id = next_id + 1, next_id + 2
        cursor.executemany(
            "INSERT INTO messages (id, conversation_id, parent_id, role, content, tool_calls, "
            "tool_call_id, name, tokens, encoding, created_at) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'o200k_base', '{stamp}')",
            rows,
        )
        raw.commit()
    finally:
        raw.close()


def timed_sweep(engine: Engine) -> tuple[float, int]:
    settings = load_settings(idle_keep_tool_results=3)
    started = time.perf_counter()
    result = sweep_idle(engine, settings, now=utcnow())
    return time.perf_counter() - started, result.cleared


def timed_raw(engine: Engine) -> float:
    started = time.perf_counter()
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO clearings (conversation_id, message_id, reason, tokens_reclaimed, "
                "created_at) SELECT m.conversation_id, m.id, 'idle', m.tokens - 60, :now "
                "FROM messages m JOIN swept s ON s.id = m.id"
            ),
            {"now": utcnow()},
        )
    return time.perf_counter() - started


def reset(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM clearings"))


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'sweep.db'}")
        upgrade(engine)
        populate(engine)
        sweeps, raws, cleared = [], [], 0
        for _ in range(REPEATS):
            seconds, cleared = timed_sweep(engine)
            sweeps.append(seconds)
            with engine.begin() as connection:
                connection.execute(text("DROP TABLE IF EXISTS swept"))
                connection.execute(
                    text("CREATE TABLE swept AS SELECT message_id AS id FROM clearings")
                )
            reset(engine)
            raws.append(timed_raw(engine))
            reset(engine)
        engine.dispose()
    expected = CONVERSATIONS * (RESULTS_PER_CONVERSATION - 3)
    if cleared != expected:
        raise RuntimeError(f"the sweep cleared {cleared} results, expected {expected}")
    return [
        Figure(
            "sweep_vs_raw_update",
            round(min(sweeps) / min(raws), 2),
            "<= 3",
            f"clearing {cleared:,} tool results of {CONVERSATIONS:,} idle conversations with the "
            "batched sweep (default batch size), divided by one raw INSERT ... SELECT of the same "
            "clearing rows (SQLite, best of 5 each, interleaved)",
        ),
    ]
