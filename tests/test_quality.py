"""The code stays lint-clean and type-checked: ruff on the tree, mypy --strict on core, workers
and bench."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.services import need_service

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "--output-format", "concise", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
    ],
    ids=["ruff", "ruff-format", "mypy"],
)
def test_tool_passes(command: list[str]) -> None:
    """The checker exits 0 on the repository."""
    tool = shutil.which(command[0], path=str(Path(sys.executable).parent)) or shutil.which(
        command[0]
    )
    if tool is None:
        need_service(command[0], "not installed; `pip install -e '.[dev]'` brings it")
    done = subprocess.run(
        [tool, *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_core_never_imports_workers_side_libraries() -> None:
    """core/ must work without Celery, Redis or litellm installed in the request path."""
    offenders = []
    for path in (ROOT / "core").rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")) and any(
                f" {lib}" in stripped.split(" import ")[0] + " "
                and stripped.split()[1].split(".")[0] == lib
                for lib in ("celery", "redis", "litellm", "kombu")
            ):
                offenders.append(f"{path.relative_to(ROOT)}: {stripped}")
    assert offenders == []
