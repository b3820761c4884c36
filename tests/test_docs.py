"""The documentation site builds with ``mkdocs build --strict``, and the README stays short."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300  # what a newcomer reads; the reference lives in docs/


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    """Every page in the nav exists and every link and anchor between pages resolves."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "index.html").exists()


def test_the_readme_is_short_and_links_only_to_existing_docs() -> None:
    """The README keeps to what a newcomer needs, and every docs page it names exists."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).exists(), target
