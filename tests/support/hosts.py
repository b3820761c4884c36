"""A host of the tests' own: a ``Recap`` on a new SQLite file in a folder, disposed after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recap.core.client import Recap
from recap.core.settings import Settings


@contextmanager
def fresh_recap(folder: Path) -> Iterator[Recap]:
    """A ``Recap`` on ``folder/r.db`` (schema made), its outputs in ``folder/o``; its engine
    disposed when the block ends."""
    settings = Settings(database_url=f"sqlite:///{folder / 'r.db'}", output_dir=folder / "o")
    host = Recap(settings, create_schema=True)
    try:
        yield host
    finally:
        host.engine.dispose()
