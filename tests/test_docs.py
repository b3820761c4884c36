"""The documentation site builds with ``mkdocs build --strict``, the README stays short, and
every setting is documented once."""

from __future__ import annotations

import os
import re
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
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).exists(), target


def _defined_settings(text: str) -> list[str]:
    """The variables a Markdown table defines: those named in the first cell of a row."""
    names = []
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            names += re.findall(r"`(RECAP_[A-Z0-9_]+)`", cells[1])
    return names


def test_every_setting_is_documented_once() -> None:
    """Each field of ``Settings`` is defined by exactly one table row across the README and
    docs/, and no row defines a variable that is not a setting."""
    from recap.core.settings import Settings

    settings = {f"RECAP_{name.upper()}" for name in Settings.model_fields}
    places: dict[str, list[str]] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in _defined_settings(page.read_text(encoding="utf-8")):
            places.setdefault(name, []).append(page.name)
    assert {name: places.get(name) for name in settings if len(places.get(name, [])) != 1} == {}
    assert sorted(set(places) - settings) == []
