"""The suite's slow tests: ``pytest -m slow``, the long end-to-end and fuzz runs that the default
``pytest`` leaves out (each keeps a fast seeded subset in the default run; see docs/testing.md).

They run in a child pytest with the suite's own servers (``tests/conftest.py``), so this module
needs what the suite needs, not the machine's PostgreSQL or Redis. The figures are counts: slow
tests that failed (must be none) and how many ran, so that a run selecting nothing shows.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from bench import Figure

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 3600  # seconds for the whole slow run


def _counts(report: Path) -> tuple[int, int, int]:
    """(ran, failed, skipped) from pytest's JUnit XML report."""
    suite = ET.parse(report).getroot()
    if suite.tag == "testsuites":
        suite = suite[0]
    tests = int(suite.get("tests", "0"))
    failed = int(suite.get("failures", "0")) + int(suite.get("errors", "0"))
    skipped = int(suite.get("skipped", "0"))
    return tests - skipped, failed, skipped


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "slow.xml"
        command = [sys.executable, "-m", "pytest", "-m", "slow", "-q", "-p", "no:cacheprovider"]
        done = subprocess.run(
            [*command, f"--junitxml={report}"], cwd=ROOT, timeout=TIMEOUT, check=False
        )
        if not report.exists():
            raise SystemExit(f"pytest -m slow wrote no report (exit code {done.returncode})")
        ran, failed, skipped = _counts(report)
    where = f"{ran} ran, {skipped} skipped"
    return [
        Figure(
            "suite_slow_failures",
            failed,
            "== 0",
            f"tests marked slow (`pytest -m slow`: the full end-to-end and fuzz runs) that failed "
            f"({where})",
        ),
        Figure("suite_slow_tests", ran, ">= 1", "tests marked slow that ran"),
    ]
