"""The conversations the tests replay (``tests/data``), and a migrated database for a URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from recap.core.settings import get_settings
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DATA_FILES = (
    "swe_agent.jsonl",
    "openhands.jsonl",
    "tau_bench_airline.jsonl",
    "toolbench_examples.jsonl",
)


def load_data(name: str) -> list[dict[str, Any]]:
    """Every conversation of one test-data file."""
    with (DATA_DIR / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def migrated(url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A migrated engine for ``url``, also set as RECAP_DATABASE_URL."""
    monkeypatch.setenv("RECAP_DATABASE_URL", url)
    get_settings.cache_clear()
    engine = make_engine(url)
    upgrade(engine)
    return engine
