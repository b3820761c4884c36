"""Running the ``recap`` command in-process and as the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from typer.testing import CliRunner

from core.settings import get_settings
from workers.cli import app


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
        [sys.executable, "-m", "workers.cli", *args],
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
