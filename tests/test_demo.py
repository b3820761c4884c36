"""`recap demo` runs the whole pipeline on the embedded default and writes its table and chart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_demo_prints_its_table_and_writes_its_chart(tmp_path: Path) -> None:
    """No server and no key: SQLite, the file broker, an in-process worker, the offline
    summarizer; every request with Recap fits the window and at least one summary is written."""
    pytest.importorskip("matplotlib", reason="the chart needs the plot extra")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECAP_")}
    done = subprocess.run(
        [sys.executable, "-m", "recap.workers.cli", "demo", "--window", "6000"],
        cwd=tmp_path,
        env={**env, "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(
        r"│\s*(\d+)\s*│\s*(\d+)\s*│\s*([\d,]+)[^│]*│\s*([\d,]+)[^│]*│\s*(\w+)", done.stdout
    )
    assert len(rows) == 8, done.stdout
    for _turn, _messages, without, with_recap, _action in rows:
        assert int(with_recap.replace(",", "")) <= 6000
        assert int(with_recap.replace(",", "")) <= int(without.replace(",", ""))
    assert "summarized" in {row[4] for row in rows}
    assert "left out)" in done.stdout, "a turn whose request left history out says so"
    assert any(int(row[2].replace(",", "")) > 6000 for row in rows), "the demo overflows without"
    chart = tmp_path / ".recap" / "demo.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
