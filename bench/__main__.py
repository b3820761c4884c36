"""Run every benchmark: ``python -m bench [name ...]``."""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import BENCHES, Figure
from bench.data import data_dir

RESULTS = Path(__file__).parent / "RESULTS.md"


def write_results(figures: list[Figure], seconds: float) -> None:
    """Rewrite RESULTS.md with this run's figures."""
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python -m bench` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()}, {platform.machine()}, data from "
        f"`{data_dir().relative_to(Path(__file__).resolve().parent.parent.parent)}`, "
        f"{seconds:.0f} s in all.",
        "",
        "| figure | value | bound | holds | what it measures |",
        "|---|---|---|---|---|",
    ]
    for f in figures:
        mark = "yes" if f.meets() else "NO"
        lines.append(
            f"| `{f.name}` | {f.value:g} | {f.bound or 'reported'} | {mark} | {f.description} |"
        )
    RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    names = argv or list(BENCHES)
    figures: list[Figure] = []
    started = time.perf_counter()
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        print(f"running bench.{name} ...", file=sys.stderr)
        figures.extend(module.run())
    if not argv:
        write_results(figures, time.perf_counter() - started)
    print(json.dumps({f.name: f.value for f in figures}))
    failed = [f.name for f in figures if not f.meets()]
    if failed:
        print(f"bounds not met: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
