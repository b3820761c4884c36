"""The database as a whole, for the CLI, the console and ``recap serve``: the process's engine
for a URL, one round trip (``/health``), the schema created or migrated (``recap init``, and
``recap serve`` at start-up), the URL as it may be shown, whether an error says the schema is
missing, and the clock the store writes with. Each is one operation of ``core.storage`` (``db``,
``migrate``, ``models``) that already takes an engine or a URL and opens its own connection;
named here so the doors never reach into the storage layer. Alembic is imported by the two
schema operations alone, so a command that only reads never loads it."""

from __future__ import annotations

from sqlalchemy import Engine

from recap.core.storage.db import INIT_HINT, display_url, get_engine, is_schema_missing, ping
from recap.core.storage.models import utcnow

__all__ = [
    "INIT_HINT",
    "display_url",
    "get_engine",
    "is_schema_missing",
    "ping",
    "prepare",
    "upgrade",
    "utcnow",
]


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Create or migrate the schema to ``revision`` (``recap init``); the revision now in place."""
    from recap.core.storage.migrate import upgrade as migrate

    return migrate(engine, revision)


def prepare(url: str) -> str | None:
    """Create the schema when the database at ``url`` has none (``recap serve`` at start-up): the
    revision it was brought to, or None when it was there already; a database that cannot be
    reached is one ``RecapError`` line, its password hidden."""
    from recap.core.storage.migrate import prepare as create

    return create(url)
