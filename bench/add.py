"""The host's append path: ``Recap.add`` of a tool result, at 500 and at 5,000 stored messages.

Two conversations built from the shared data (500 and 5,000 messages) live in one database. Each
round adds an assistant message with one tool call to both (not timed), then times ``Recap.add``
of its result on each, and a raw ``INSERT`` of the same row (its values computed beforehand,
committed on its own) into a third conversation. The figures are medians of the rounds:

- ``add_growth``: the add at 5,000 messages over the add at 500. An append that reads the branch
  grows with the conversation; one that reads only the recent messages does not.
- ``add_vs_insert``: the add at 5,000 messages over the raw INSERT: what validation, token
  counting, the per-conversation lock and the pairing check cost on top of the write itself.

SQLite is timed in CPU time of this process (the database runs in it, and CPU time is steadier
than wall time on a shared machine); PostgreSQL in wall time (the server does its share in
another process). The ``_postgres`` figures are reported when a server answers at
``RECAP_TEST_POSTGRES_URL`` (default: the local test server, ``bench.services``), in a database
made for the run.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import Figure
from bench.assemble import long_conversation
from bench.data import load_all
from bench.services import POSTGRES_ADMIN_URL

MODEL = "gpt-4o-mini"
SHORT, LONG = 500, 5_000  # the two conversation lengths compared
ROUNDS = 41  # rounds timed per conversation; the median of an odd count is one of them
WARMUP_ROUNDS = 3  # untimed first rounds: statement caches and the tokenizer warm up
GROWTH_BOUND = "<= 1.3"  # an add at 5,000 messages costs about what it costs at 500
INSERT_BOUND = "<= 4"  # an add costs a few raw inserts at most
POSTGRES_URL = POSTGRES_ADMIN_URL
RESULT_TEXT = (  # a typical small tool result (well under the truncation limits)
    "collected 48 items\n\ntests/test_store.py ........................ [ 50%]\n"
    "tests/test_reads.py ........................ [100%]\n\n48 passed in 1.92s\n"
)
RAW_INSERT = (
    "INSERT INTO messages (conversation_id, parent_id, role, content, tokens, tool_call_id, "
    "name, encoding, created_at) VALUES (:conversation_id, :parent_id, :role, :content, "
    ":tokens, :tool_call_id, :name, :encoding, :created_at)"
)


Measure = Callable[[str, list[dict[str, Any]], str, Path], list[Figure]]


def on_both_databases(name: str, measure: Measure) -> list[Figure]:
    """``measure(url, records, suffix, folder)`` on SQLite, then on a fresh PostgreSQL database
    (figures suffixed ``_postgres``) when the server is reachable."""
    records = load_all()
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(f"sqlite:///{Path(folder) / 'bench.db'}", records, "", Path(folder))
        database = _postgres_database()
        if database is None:
            print(f"bench.{name}: PostgreSQL not reachable, left out", file=sys.stderr)
            return figures
        url, drop = database
        try:
            figures += measure(url, records, "_postgres", Path(folder))
        finally:
            drop()
    return figures


def run() -> list[Figure]:
    return on_both_databases("add", _measure)


def _measure(url: str, records: list[dict[str, Any]], suffix: str, folder: Path) -> list[Figure]:
    from recap.core import service
    from recap.core.client import Recap
    from recap.core.settings import load_settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade

    engine = make_engine(url)
    upgrade(engine)
    settings = load_settings(output_dir=folder / "outputs")
    recap = Recap(settings, engine)
    short, long = f"short{suffix}", f"long{suffix}"
    for cid, size in ((short, SHORT), (long, LONG)):
        record = {"id": cid, "messages": long_conversation(records, size)}
        service.import_conversations(engine, [record], settings, model=MODEL)
    raw = recap.new(f"raw{suffix}", model=MODEL)
    clock = time.process_time if engine.dialect.name == "sqlite" else time.perf_counter
    times: dict[str, list[float]] = {short: [], long: [], raw: []}
    for index in range(WARMUP_ROUNDS + ROUNDS):
        for cid in (short, long):
            call_id = f"bench_{index}"
            recap.add(cid, _assistant(call_id))
            result = _result(call_id)

            def add(c: str = cid, r: dict[str, Any] = result) -> int:
                return recap.add(c, r)

            times[cid].append(_timed(clock, add))
        times[raw].append(_timed(clock, _raw_insert(engine, raw)))
    engine.dispose()
    median = {cid: statistics.median(values[WARMUP_ROUNDS:]) for cid, values in times.items()}
    where = "PostgreSQL" if suffix else "SQLite"
    return [
        Figure(
            f"add_growth{suffix}",
            round(median[long] / median[short], 2),
            GROWTH_BOUND,
            f"median Recap.add of a tool result to a {LONG}-message conversation over the same "
            f"at {SHORT} messages ({where}, {ROUNDS} rounds; {median[long] * 1e3:.2f} ms vs "
            f"{median[short] * 1e3:.2f} ms)",
        ),
        Figure(
            f"add_vs_insert{suffix}",
            round(median[long] / median[raw], 2),
            INSERT_BOUND,
            f"median Recap.add of a tool result at {LONG} messages over a raw INSERT of the "
            f"same row committed on its own ({where}; raw insert {median[raw] * 1e3:.2f} ms)",
        ),
    ]


def _timed(clock: Callable[[], float], func: Callable[[], Any]) -> float:
    started = clock()
    func()
    return clock() - started


def _assistant(call_id: str) -> dict[str, Any]:
    arguments = json.dumps({"command": "pytest -q"})
    call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": "bash", "content": RESULT_TEXT}


def _raw_insert(engine: Any, conversation_id: str) -> Callable[[], None]:
    """A plain INSERT of the result's row (tokens counted beforehand) in its own transaction."""
    from sqlalchemy import text

    from recap.core.counting import tokens
    from recap.core.storage.models import utcnow

    encoding = tokens.encoding_name_for(MODEL)
    values = {
        "conversation_id": conversation_id,
        "parent_id": None,
        "role": "tool",
        "content": RESULT_TEXT,
        "tokens": tokens.count_message(_result("raw"), encoding),
        "tool_call_id": "raw",
        "name": "bash",
        "encoding": encoding,
        "created_at": utcnow(),
    }
    statement = text(RAW_INSERT)

    def insert() -> None:
        with engine.connect() as connection:
            connection.execute(statement, values)
            connection.commit()

    return insert


def _postgres_database() -> tuple[str, Callable[[], None]] | None:
    """A fresh database on the PostgreSQL server and a function that drops it, or None."""
    from sqlalchemy import create_engine, text

    name = f"recap_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception:  # any failure to reach or use the server leaves PostgreSQL out
        admin.dispose()
        return None

    def drop() -> None:
        from recap.core.storage.db import dispose_engines

        dispose_engines()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}", drop
