"""Running the ``recap`` command in-process and as the installed console script, and what the
bad-input tables share: a row's command with its placeholders filled in (``run_with_paths``), the
refusal it must end in (``assert_refused``), and a snapshot of everything it could have changed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, select
from typer.testing import CliRunner

from recap.core.settings import get_settings
from recap.workers.cli import app

FAILED = 1  # Recap's exit code for bad input it checked itself
DATABASE_FILE = "recap.db"  # the file name of conftest's sqlite_url


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        assert self.code == 0, self.stderr
        return json.loads(self.stdout)


def recap(*args: str) -> Result:
    """Run a command in-process (settings re-read), returning exit code, stdout and stderr."""
    get_settings.cache_clear()
    outcome = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return Result(outcome.exit_code, outcome.stdout, outcome.stderr)


def recap_process(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """Run the console script in a child process."""
    done = subprocess.run(
        [sys.executable, "-m", "recap.workers.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def assert_one_line_error(result: Result, fragment: str) -> None:
    """Non-zero exit, one clear line on stderr naming the problem, no traceback."""
    assert result.code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert fragment.lower() in lines[0].lower(), lines[0]


def assert_refused(result: Result, code: int, fragment: str) -> None:
    """The exact exit code, exactly one non-empty ``recap: error:`` line on stderr naming the
    problem, no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.code == code, result.stderr[-2000:]
    assert len(lines) == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("recap: error: "), lines[0]
    assert fragment.lower() in lines[0].lower(), lines[0]


def snapshot(engine: Engine, tmp: Path, database_file: str = DATABASE_FILE) -> dict[str, Any]:
    """Every row of every table, and every file under ``tmp`` with its content hash and time
    (the SQLite database's own files aside: a checkpoint rewrites them without changing a row;
    the rows are compared instead)."""
    metadata = MetaData()
    metadata.reflect(engine)
    with engine.connect() as connection:
        tables = {
            name: sorted(map(repr, connection.execute(select(table))))
            for name, table in metadata.tables.items()
        }
    files = {
        str(path.relative_to(tmp)): (
            hashlib.sha256(path.read_bytes()).hexdigest(),
            path.stat().st_mtime_ns,
        )
        for path in sorted(tmp.rglob("*"))
        if path.is_file() and not path.name.startswith(database_file)
    }
    return {"tables": tables, "files": files}


def _resolve(value: str, paths: Mapping[str, str]) -> str:
    for key, path in paths.items():
        value = value.replace("{" + key + "}", path)
    return value


def run_with_paths(
    args: Sequence[str],
    env: Mapping[str, str],
    paths: Mapping[str, str],
    monkeypatch: pytest.MonkeyPatch,
    *,
    process: bool = False,
) -> Result:
    """A table row's command, its ``{placeholder}`` arguments and environment values replaced by
    ``paths``: in-process, or as a child process (the Celery app reads its broker at import)."""
    resolved = [_resolve(arg, paths) for arg in args]
    values = {name: _resolve(value, paths) for name, value in env.items()}
    if process:
        return recap_process(*resolved, env={**os.environ, **values}, timeout=60)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return recap(*resolved)
