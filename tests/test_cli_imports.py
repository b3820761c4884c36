"""Commands that call no model never import litellm or Celery (litellm alone takes seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.data import DATA_DIR

PROBE = """
import sys
from typer.testing import CliRunner
from recap.workers.cli import app
runner = CliRunner()
for args in ({commands}):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, (args, result.output)
heavy = sorted(name for name in ("litellm", "celery", "kombu") if name in sys.modules)
print(",".join(heavy) or "none")
"""


@pytest.mark.parametrize(
    "commands",
    [
        [["--help"]],
        [
            ["init"],
            ["import", "DATA"],
            ["stats", "c"],
            ["summaries", "c"],
            ["export", "c"],
            ["assemble", "c"],
            ["usage", "c", "--prompt-tokens", "100"],
            ["sweep"],
            ["cleanup"],
        ],
    ],
    ids=["help", "data-commands"],
)
def test_no_model_library_is_imported(tmp_path: Path, commands: list[list[str]]) -> None:
    """After running these commands in one process, neither litellm nor Celery was imported."""
    data = tmp_path / "one.jsonl"
    data.write_text(
        (DATA_DIR / "openhands.jsonl")
        .read_text()
        .splitlines()[3]
        .replace('"id": "', '"id": "c", "old_id": "', 1)
        + "\n"
    )
    resolved = [[str(data) if part == "DATA" else part for part in c] for c in commands]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RECAP_")},
        "RECAP_DATABASE_URL": f"sqlite:///{tmp_path / 'r.db'}",
        "RECAP_OUTPUT_DIR": str(tmp_path / "out"),
    }
    code = PROBE.format(commands=", ".join(repr(tuple(c)) for c in resolved) + ",")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "none"
