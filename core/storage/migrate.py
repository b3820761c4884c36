"""Schema migrations through Alembic, callable from the CLI and from tests."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from recap.core.errors import RecapError, SchemaMissingError

MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    """An Alembic config that needs no ini file and runs on the given engine."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Create or migrate the schema to ``revision``; returns the revision now in place."""
    config = alembic_config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    return current_revision(engine) or ""


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    """The newest revision the migrations define."""
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def schema_drift(engine: Engine) -> list[object]:
    """Differences between the migrated database and the models (empty when they agree)."""
    from alembic.autogenerate import compare_metadata
    from sqlmodel import SQLModel

    import recap.core.storage.models  # noqa: F401  (registers the tables)

    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, SQLModel.metadata))


def prepare(url: str) -> str | None:
    """Create the schema when the database at ``url`` has none (``recap init``'s migration): the
    revision it was brought to, or None when it was there already. A database that cannot be
    reached is one ``RecapError`` line, its password hidden."""
    from recap.core.storage.db import display_url, make_engine, require_schema

    engine = make_engine(url, create=True)
    try:
        try:
            require_schema(engine)
            return None
        except SchemaMissingError:
            return str(upgrade(engine))
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise RecapError(f"cannot open the database {display_url(url)}: {reason}") from None
    finally:
        engine.dispose()
