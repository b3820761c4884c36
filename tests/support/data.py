"""The conversations the tests replay (``tests/data``), and a migrated database for a URL."""

from __future__ import annotations

import atexit
import json
import shutil
import sqlite3
import tempfile
import uuid
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


_PG_TEMPLATES: dict[str, str] = {}  # server URL up to the database name -> its template's name


def _drop_database(server: str, name: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    except Exception:  # the run's own server may be stopped already: nothing is left
        pass
    finally:
        admin.dispose()


def _postgres_template(server: str) -> str:
    """A database migrated to head once per test process on this server (``recap_test_``
    named, as every database the suite makes; dropped when the process ends)."""
    if server not in _PG_TEMPLATES:
        from sqlalchemy import create_engine, text

        name = f"recap_test_template_{uuid.uuid4().hex[:12]}"
        admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        atexit.register(_drop_database, server, name)
        engine = make_engine(f"{server}/{name}")
        upgrade(engine)
        engine.dispose()
        _PG_TEMPLATES[server] = name
    return _PG_TEMPLATES[server]


def _copy_postgres_template(url: str) -> bool:
    """Make the suite's empty database ``url`` again as a copy of the process's template;
    whether it did (only databases named ``recap_test_...``, which nothing has used yet)."""
    from sqlalchemy import create_engine, text

    server, name = url.rsplit("/", 1)
    if not url.startswith("postgresql") or not name.startswith("recap_test_") or "?" in name:
        return False
    template = _postgres_template(server)
    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            used = connection.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"), {"name": name}
            ).scalar()
            if used:
                return False
            connection.execute(text(f'DROP DATABASE "{name}"'))
            connection.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    finally:
        admin.dispose()
    return True


def migrated(url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A migrated engine for ``url``, also set as RECAP_DATABASE_URL. A new SQLite file is a copy
    of a template migrated once per process (the schema the migrations make, without running them
    for every test), and so is a new database of the suite's on PostgreSQL (``CREATE DATABASE ...
    TEMPLATE``); any other database is migrated."""
    monkeypatch.setenv("RECAP_DATABASE_URL", url)
    get_settings.cache_clear()
    path = sqlite_file(url)
    fresh = path is not None and not path.exists()
    engine = make_engine(url)  # creates a new SQLite file, empty and private
    if fresh and path is not None and path.stat().st_size == 0:
        path.write_bytes(_sqlite_template().read_bytes())  # the file keeps its mode
    elif path is None and _copy_postgres_template(url):
        pass
    else:
        upgrade(engine)
    return engine
