"""The conversations the tests replay (``tests/data``), and a migrated database for a URL."""

from __future__ import annotations

import atexit
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from recap.core.settings import get_settings
from recap.core.storage.db import make_engine, sqlite_file
from recap.core.storage.migrate import upgrade

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DATA_FILES = (
    "swe_agent.jsonl",
    "openhands.jsonl",
    "tau_bench_airline.jsonl",
    "toolbench_examples.jsonl",
)


def load_data(name: str) -> list[dict[str, Any]]:
    """Every conversation of one test-data file."""
    with (DATA_DIR / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


_TEMPLATE: list[Path] = []  # this process's migrated, empty SQLite file, made on first use


def _sqlite_template() -> Path:
    """An empty SQLite database migrated to head once per test process (in rollback-journal mode,
    so that it is one file), which new SQLite databases start as a copy of."""
    if not _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="recap-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = folder / "template.db"
        engine = make_engine(f"sqlite:///{path}")
        upgrade(engine)
        engine.dispose()
        with sqlite3.connect(path) as connection:
            connection.execute("PRAGMA journal_mode=DELETE")
        connection.close()
        _TEMPLATE.append(path)
    return _TEMPLATE[0]


def migrated(url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A migrated engine for ``url``, also set as RECAP_DATABASE_URL. A new SQLite file is a copy
    of a template migrated once per process (the schema the migrations make, without running them
    for every test); any other database is migrated."""
    monkeypatch.setenv("RECAP_DATABASE_URL", url)
    get_settings.cache_clear()
    path = sqlite_file(url)
    fresh = path is not None and not path.exists()
    engine = make_engine(url)  # creates a new SQLite file, empty and private
    if fresh and path is not None and path.stat().st_size == 0:
        path.write_bytes(_sqlite_template().read_bytes())  # the file keeps its mode
    else:
        upgrade(engine)
    return engine
