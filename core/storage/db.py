"""Engines and sessions: SQLite with WAL and a busy timeout, PostgreSQL as configured.

Only ``recap init`` (and a host that asks for it) creates a database: every other use opens an
SQLite file read-write without creating it, so a mistyped path or a read command before
``recap init`` changes nothing on disk and says what to do.

Every write transaction takes the write lock as it begins (``write_scope``, ``begin_write``): on
SQLite ``BEGIN IMMEDIATE``, which waits for other writers within the busy timeout. A deferred
transaction that reads first and writes later cannot wait: when another process wrote meanwhile,
its upgrade to a write fails at once with "database is locked", whatever the timeout.

A server database's pool follows the process's concurrency when a worker says how many threads
it runs (``size_pool``): each thread holds at most one connection at a time, and none while the
model is called, so a worker of 16 threads opens at most 16 connections, and keeps them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DataError, DBAPIError, NoSuchModuleError
from sqlmodel import Session

from recap.core.errors import DatabaseUrlError, InputError, SchemaMissingError
from recap.core.storage import private

SQLITE_BUSY_TIMEOUT_MS = 30_000  # writers wait for each other instead of failing at once
URL_SETTING = "RECAP_DATABASE_URL"
INIT_HINT = "run `recap init` first"
SCHEMA_TABLE = "conversations"  # present once the first migration has run
DEFAULT_POOL_SIZE = 5  # SQLAlchemy's own default, for processes that never call size_pool
DEFAULT_MAX_OVERFLOW = 10
_pool: dict[str, int] = {"pool_size": DEFAULT_POOL_SIZE, "max_overflow": DEFAULT_MAX_OVERFLOW}
POSTGRES_UNDEFINED_TABLE = "42P01"  # SQLSTATE of a query on a table that does not exist


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def url_problem(url: str | URL) -> str | None:
    """Why ``url`` names no database SQLAlchemy can open, or None when it does."""
    try:
        make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"not a database URL Recap can use ({reason}); expected for example "
            "sqlite:///./recap.db or postgresql+psycopg://user@host/db"
        )
    return None


def parse_url(url: str | URL) -> URL:
    """The URL, checked for a database SQLAlchemy knows; a ``DatabaseUrlError`` otherwise."""
    problem = url_problem(url)
    if problem is not None:
        raise DatabaseUrlError(f"{URL_SETTING}: {problem}")
    return make_url(url)


def sqlite_file(url: str | URL) -> Path | None:
    """The file of a file-backed SQLite URL; None for other databases and in-memory SQLite."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database:
        return None
    if database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def display_url(url: str | URL) -> str:
    """The database URL as it may be shown in a line or a log: its password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def ping(engine: Engine) -> None:
    """One round trip to the database (``/health``); raises what the driver raises."""
    with engine.connect() as connection:
        connection.execute(text("select 1"))


def make_engine(url: str | URL, *, create: bool = True, **kwargs: Any) -> Engine:
    """An engine for any SQLAlchemy URL; SQLite files get WAL and a busy timeout.

    With ``create`` an SQLite file and its folder are created when missing (``recap init``);
    without it a missing file is a ``SchemaMissingError`` and the file is opened in read-write
    mode, so SQLite never creates it behind the caller's back.
    """
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        kwargs.setdefault("pool_pre_ping", True)
        for key, value in _pool.items():
            kwargs.setdefault(key, value)
        return create_engine(parsed, **kwargs)
    path = sqlite_file(parsed)
    if path is not None and create:
        _make_private(path)
    elif path is not None:
        if not path.is_file():
            raise SchemaMissingError(f"the database {path} does not exist; {INIT_HINT}")
        target = str(path.resolve())
        parsed = parsed.set(
            database=f"file:{quote(target)}", query={**parsed.query, "mode": "rw", "uri": "true"}
        )
    kwargs.setdefault("connect_args", {"check_same_thread": False, "timeout": 30})
    engine = create_engine(parsed, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    _hook(engine)
    return engine


def _make_private(path: Path) -> None:
    """The SQLite file's folders and the file itself, private to the user (0700 and 0600; SQLite
    gives its ``-wal`` and ``-shm`` files the database file's mode) when Recap creates them."""
    try:
        private.make_folder(path.parent)
    except OSError as exc:
        raise DatabaseUrlError(
            f"{URL_SETTING}: cannot create the folder {path.parent} for the SQLite database "
            f"({exc.strerror or exc})"
        ) from None
    try:
        private.create_file(path)
    except OSError as exc:
        raise DatabaseUrlError(
            f"{URL_SETTING}: cannot create the SQLite database {path} ({exc.strerror or exc})"
        ) from None


def size_pool(connections: int) -> None:
    """Server-database engines made from now on keep up to ``connections`` connections and open
    no more (``pool_size``, no overflow): a worker calls it with its thread count at start-up,
    before its first engine. Engines already made keep their pool."""
    if connections < 1:
        raise ValueError(f"a pool needs at least one connection, not {connections}")
    _pool.update(pool_size=connections, max_overflow=0)


def pool_settings() -> dict[str, int]:
    """``pool_size`` and ``max_overflow`` of the next server-database engine."""
    return dict(_pool)


_engines: dict[tuple[str, bool], Engine] = {}


def get_engine(url: str, *, create: bool = True) -> Engine:
    """The process-wide engine for a URL, created on first use (see ``make_engine``)."""
    engine = _engines.get((url, create))
    if engine is None:
        engine = _engines[(url, create)] = make_engine(url, create=create)
    return engine


def dispose_engines() -> None:
    """Close every pooled connection (after a fork, or at the end of a test)."""
    for engine in _engines.values():
        engine.dispose()
    _engines.clear()


def is_schema_missing(exc: BaseException) -> bool:
    """Whether a database error says a Recap table does not exist (no ``recap init`` yet)."""
    if not isinstance(exc, DBAPIError):
        return False
    if getattr(exc.orig, "sqlstate", None) == POSTGRES_UNDEFINED_TABLE:
        return True
    return "no such table" in str(exc.orig).lower()


def require_schema(engine: Engine) -> None:
    """A ``SchemaMissingError`` unless the database has Recap's tables."""
    if not inspect(engine).has_table(SCHEMA_TABLE):
        raise SchemaMissingError(f"the database has no Recap schema; {INIT_HINT}")


# --- write transactions ----------------------------------------------------------------------

WRITE_OPTION = "recap_write"  # execution option marking a transaction that writes
_hooked: weakref.WeakSet[Engine] = weakref.WeakSet()  # SQLite engines with the hook
_hook_lock = threading.Lock()


def _begin_immediate(connection: Connection) -> None:
    """SQLAlchemy's recipe for pysqlite, scoped to write transactions: they begin as writes
    (``BEGIN IMMEDIATE``), so whatever they read is read under the write lock they hold."""
    if connection.get_execution_options().get(WRITE_OPTION):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _hook(engine: Engine) -> None:
    """Attach the BEGIN IMMEDIATE hook to a SQLite engine, once (engines made elsewhere than
    ``make_engine`` get it on their first write)."""
    if engine.dialect.name != "sqlite" or engine in _hooked:
        return
    with _hook_lock:
        if not event.contains(engine, "begin", _begin_immediate):
            event.listen(engine, "begin", _begin_immediate)
        _hooked.add(engine)


def begin_write(session: Session) -> Connection:
    """The session's connection, its transaction begun as a write: on SQLite ``BEGIN
    IMMEDIATE``, the write lock taken (waiting within the busy timeout) before the first read;
    elsewhere the database's own transaction (a writer there takes row locks as it goes). Call
    it first on a fresh session; on a session already in a transaction it is that
    transaction's connection."""
    if session.in_transaction():
        return session.connection()
    bind = session.get_bind()
    if isinstance(bind, Engine):
        _hook(bind)
    return session.connection(execution_options={WRITE_OPTION: True})


def without_jit(session: Session) -> None:
    """On PostgreSQL, no JIT compilation for the rest of the session's transaction (``SET
    LOCAL``, so a pooler's shared connection keeps its own setting afterwards). A set-based
    statement over a large table is planned above ``jit_above_cost`` and compiled on every
    execution: on the idle sweep over 1,000,000 messages that was about 70 ms a batch, most of
    the batch's time, for statements that run in a few milliseconds. Elsewhere, nothing."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL jit = off"))


@contextmanager
def write_scope(engine: Engine) -> Iterator[Session]:
    """``session_scope`` for a transaction that writes: begun as a write (``begin_write``)."""
    with session_scope(engine) as session:
        begin_write(session)
        yield session


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A short session: committed on success, rolled back on error, always closed.

    A value the database refuses (a number beyond its column, text it cannot hold) is an
    ``InputError`` after the rollback, for the input checks of ``core.values.limits`` to have
    missed.
    """
    session = Session(engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except (DataError, OverflowError) as exc:
        session.rollback()
        raise InputError(f"a value does not fit its database column ({_first_line(exc)})") from exc
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
