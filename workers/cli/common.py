"""What the commands share besides error handling: the settings and database engine, read on
first use, and the output, one JSON object with ``--json`` or a human rendering, with secrets
masked either way."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recap.core.settings import Settings


class _OnFirstUse:
    """A module imported when first used: `recap --help` and argument errors stay instant, and
    each command imports only what it needs (SQLAlchemy alone takes a while to import)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)


service: Any = _OnFirstUse("recap.core.service")


def settings() -> Settings:
    """The settings, read once; an invalid value is one clear error."""
    from recap.core.redact import known_secrets
    from recap.core.settings import get_settings
    from recap.workers.logs import register_secrets

    loaded = get_settings()
    register_secrets(known_secrets(loaded))  # log lines on stderr mask them too
    return loaded


def known_secrets() -> list[str]:
    """The configured secrets, or none when the settings themselves are what failed."""
    from recap.core.redact import known_secrets as secrets_of

    try:
        return secrets_of(settings())
    except Exception:  # invalid settings: key-shaped strings are still masked by pattern
        return []


def engine(*, create: bool = False) -> Any:
    """The engine for ``RECAP_DATABASE_URL``. Only ``create`` (``recap init``) creates an SQLite
    file: any other command on a missing one says to run ``recap init`` and leaves no file."""
    from recap.core.service.database import get_engine

    return get_engine(settings().database_url, create=create)


def read_text(path: Path) -> str:
    """A file the command was given, within ``RECAP_MAX_INPUT_BYTES``."""
    from recap.core.inputs import read_text as read_bounded

    return read_bounded(path, settings().max_input_bytes)


def emit(
    payload: dict[str, Any],
    as_json: bool,
    human: Callable[[], None] | None = None,
    *,
    verbatim: bool = False,
) -> None:
    """Print the JSON object, or the human rendering when ``--json`` is not given. Its texts are
    masked first, in place, so the human rendering shows them masked too; ``verbatim`` (a
    conversation's own content) masks only the configured secrets, never key-shaped text."""
    payload.update(_masked(payload, known_secrets(), verbatim))
    if as_json or human is None:
        sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
    else:
        human()


def _masked(value: Any, secrets: list[str], verbatim: bool) -> Any:
    """``value`` with every text in it masked: key-shaped text and the configured secrets, or
    only the configured secrets when ``verbatim``."""
    from recap.core.redact import mask_value, redact

    if isinstance(value, str):
        if not verbatim:
            return redact(value, secrets)
        for secret in secrets:
            value = value.replace(secret, mask_value(secret))
        return value
    if isinstance(value, dict):
        return {k: _masked(v, secrets, verbatim) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v, secrets, verbatim) for v in value]
    return value


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """A rich table on stdout."""
    from rich.console import Console
    from rich.table import Table

    view = Table(title=title)
    for column in columns:
        view.add_column(column)
    for row in rows:
        view.add_row(*(str(cell) for cell in row))
    Console().print(view)
