"""Writes that outlast a database restart: what counts as "unavailable", and the backoff.

A write that fails because the database is unreachable (a restart, a failover) is tried again
with what it writes kept in memory: waits from ``DB_RETRY_FIRST_SECONDS`` doubling to
``DB_RETRY_MAX_SECONDS``, for at most ``DB_RETRY_WINDOW_SECONDS`` and never past the lease's
expiry less ``LEASE_SAFETY_SECONDS``; after that the run fails to Celery, which retries it with
backoff.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import structlog
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

DB_RETRY_FIRST_SECONDS = 0.25  # a restart drops connections for a second or two
DB_RETRY_MAX_SECONDS = 4.0  # one wait between write attempts is at most this
DB_RETRY_WINDOW_SECONDS = 60.0  # long enough for a database restart or a managed failover
LEASE_SAFETY_SECONDS = 5.0  # stop retrying while the lease is surely still ours
# SQLSTATE classes of a database that is not there: connection exceptions (08xxx) and an
# operator's intervention (57Pxx: shutting down, starting up, crash recovery).
UNAVAILABLE_SQLSTATES = ("08", "57P")

T = TypeVar("T")
log = structlog.get_logger("recap.compress")


def database_unavailable(exc: BaseException) -> bool:
    """Whether a database error means "not reachable right now" (worth retrying), not a bad
    statement or data."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    if state:
        return str(state).startswith(UNAVAILABLE_SQLSTATES)
    message = str(exc.orig).lower()
    return "no such" not in message and "syntax" not in message  # SQLite: locked, I/O


def retry_window(lease_expires_at: datetime | None, now: datetime) -> float:
    """How long a write may be retried: the window, cut short while a lease must stay ours."""
    if lease_expires_at is None:
        return DB_RETRY_WINDOW_SECONDS
    left = (lease_expires_at - now).total_seconds() - LEASE_SAFETY_SECONDS
    return max(0.0, min(DB_RETRY_WINDOW_SECONDS, left))


def durably(write: Callable[[], T], *, window: float, step: str, **fields: Any) -> T:
    """``write()``, tried again with backoff while the database is unavailable, for at most
    ``window`` seconds; the last error is raised when the window is spent. Each wait is logged
    with ``step`` and ``fields``."""
    ends = time.monotonic() + window
    wait = DB_RETRY_FIRST_SECONDS
    for tries in itertools.count(1):
        try:
            return write()
        except DBAPIError as exc:
            left = ends - time.monotonic()
            if not database_unavailable(exc) or left <= 0:
                raise
            log.warning(
                "database_unavailable_retrying",
                **fields,
                step=step,
                tries=tries,
                wait_s=round(min(wait, left), 2),
                error=first_line(exc),
            )
            time.sleep(min(wait, left))
            wait = min(wait * 2, DB_RETRY_MAX_SECONDS)
    raise AssertionError("itertools.count never ends")


def first_line(exc: BaseException) -> str:
    """The error's type and the first line of its message (a driver's error runs long)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
