"""How a command fails: Recap's user errors and what is wrong around the command (the database,
the broker, a file) become one masked line on stderr and exit code 1; a defect keeps its
traceback. Usage errors (a bad option) are worded by ``workers.cli.root`` and exit 2."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from recap.core.errors import RecapError
from recap.workers.cli.common import known_secrets, settings

F = TypeVar("F", bound=Callable[..., Any])
USER_ERRORS = (RecapError,)  # settings, model and input errors all derive from it


def fail(message: str, code: int = 1) -> None:
    """One clear line on stderr (masked: an error can quote a secret), then exit non-zero."""
    from recap.core.redact import one_line, redact

    typer.echo(f"recap: error: {one_line(redact(message, known_secrets()))}", err=True)
    raise typer.Exit(code)


def handles_errors(func: F) -> F:
    """Turn Recap's user errors into one line on stderr and a non-zero exit, no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except USER_ERRORS as exc:
            fail(str(exc))
        except Exception as exc:
            message = _environment_error(exc)
            if message is None:
                raise
            fail(message)

    return wrapper  # type: ignore[return-value]


def _environment_error(exc: Exception) -> str | None:
    """One line for what is wrong around the command (database, broker, files), or None for a
    defect, which keeps its traceback."""
    if isinstance(exc, RecursionError):
        return "the input is nested too deeply to read"
    broker_error = _broker_error(exc)
    if broker_error is not None:
        return broker_error
    if "sqlalchemy" in sys.modules:
        from sqlalchemy.exc import DBAPIError

        from recap.core.service.database import INIT_HINT, is_schema_missing

        if is_schema_missing(exc):
            return f"the database has no Recap schema; {INIT_HINT}"
        if isinstance(exc, DBAPIError):
            reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
            return f"database error ({_database_named()}): {reason or type(exc.orig).__name__}"
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    return None


def _database_named() -> str:
    """``RECAP_DATABASE_URL`` and its value, password hidden, for a database error."""
    from recap.core.service.database import display_url

    return f"RECAP_DATABASE_URL={display_url(settings().database_url)}"


def _broker_error(exc: Exception) -> str | None:
    """One line for a broker that cannot be reached or refuses the login, or None. Only looked
    for once a command has imported kombu: the others never talk to a broker."""
    if "kombu" not in sys.modules:
        return None
    from kombu.exceptions import OperationalError

    errors: tuple[type[BaseException], ...] = (OperationalError,)
    if "amqp" in sys.modules:  # RabbitMQ refusing the login is not wrapped by kombu
        # amqp ships no types (a stub gap): its exceptions are classes all the same
        from amqp.exceptions import (  # type: ignore[import-untyped,unused-ignore]
            AccessRefused,
        )
        from amqp.exceptions import ConnectionError as AMQPConnectionError

        errors += (AccessRefused, AMQPConnectionError)
    if not isinstance(exc, errors):
        return None
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot reach the broker (RECAP_BROKER_URL): {reason}"


# A broker that has not answered after these tries (about a second) is down: say so, rather
# than let kombu retry for minutes or print its traceback.
BROKER_CONNECT_RETRIES = 2
BROKER_RETRY_SECONDS = 0.3
BROKER_CONNECT_TIMEOUT = 2.0


def require_broker() -> None:
    """Check that the configured broker answers, with bounded retries, before a command sends
    anything (or changes anything in the database on the way)."""
    from recap.workers.app import app as celery_app

    with celery_app.connection_for_write() as connection:
        connection.ensure_connection(
            max_retries=BROKER_CONNECT_RETRIES,
            interval_start=BROKER_RETRY_SECONDS,
            interval_step=BROKER_RETRY_SECONDS,
            interval_max=BROKER_RETRY_SECONDS,
            timeout=BROKER_CONNECT_TIMEOUT,
        )
