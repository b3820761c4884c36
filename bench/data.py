"""Where the benchmarks find conversations: ``../shared/data`` when present, else tests/data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = (ROOT.parent / "shared" / "data", ROOT / "tests" / "data")
SOURCES = (
    "swe_agent.jsonl",
    "openhands.jsonl",
    "tau_bench_airline.jsonl",
    "toolbench_examples.jsonl",
)


def data_dir() -> Path:
    """The first folder holding the conversation files."""
    for folder in CANDIDATES:
        if all((folder / name).exists() for name in SOURCES):
            return folder
    raise FileNotFoundError("no conversation data: expected ../shared/data or tests/data")


def load(name: str) -> list[dict[str, Any]]:
    """Every conversation of one source file."""
    with (data_dir() / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load_all() -> list[dict[str, Any]]:
    """Every conversation of every source."""
    return [record for name in SOURCES for record in load(name)]
