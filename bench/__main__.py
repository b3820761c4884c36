"""Run every benchmark: ``python -m bench [name ...]``.

Each module runs in a process of its own, so that no benchmark measures itself against the heap,
caches or threads another one left behind.
"""

from __future__ import annotations

import importlib
import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from bench import BENCHES, Figure
from bench.data import data_dir

RESULTS = Path(__file__).parent / "RESULTS.md"
CHILD_FLAG = "--child"
# the doors' figures again as a table by door (``bench doors``): its heading, and the columns
# (each figure named ``doors_<door>_<suffix>``)
DOOR_TABLE = "## By door (`python -m bench doors`)"
DOOR_COLUMNS = (
    ("requests", "model requests"),
    ("over_window", "over the window"),
    ("dead_ends", "dead ends"),
    ("silent_truncations", "silent truncations"),
    ("calibration_error", "calibration error (p90)"),
    ("usage_recorded", "usage recorded"),
)


def write_results(figures: list[Figure], seconds: float) -> None:
    """Rewrite RESULTS.md with this run's figures."""
    root = Path(__file__).resolve().parent.parent
    source = data_dir().resolve()
    where = source.relative_to(root) if source.is_relative_to(root) else Path("..") / "shared/data"
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python -m bench` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()}, {platform.machine()}, data from `{where}`, "
        f"{seconds:.0f} s in all. Each module runs in its own process.",
        "",
        "| figure | value | bound | holds | what it measures |",
        "|---|---|---|---|---|",
    ]
    lines += [_row(f) for f in figures]
    table = door_table(figures)
    lines += ["", *table] if table else []
    RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")


def door_table(figures: list[Figure]) -> list[str]:
    """The doors' figures as a table, a row per door (none when the run had no doors)."""
    values = {f.name: f for f in figures}
    doors = [
        f.name.removeprefix("doors_").removesuffix("_requests")
        for f in figures
        if f.name.startswith("doors_") and f.name.endswith("_requests")
    ]
    if not doors:
        return []
    lines = [
        DOOR_TABLE,
        "",
        "| door | " + " | ".join(title for _, title in DOOR_COLUMNS) + " |",
        "|---|" + "---|" * len(DOOR_COLUMNS),
    ]
    for door in doors:
        cells = []
        for suffix, _ in DOOR_COLUMNS:
            f = values.get(f"doors_{door}_{suffix}")
            cells.append("" if f is None else f"{f.value:g}" + ("" if f.meets() else " (NO)"))
        lines.append(f"| {door} | " + " | ".join(cells) + " |")
    return lines


def _split_door_table(lines: list[str]) -> tuple[list[str], list[str]]:
    """The file's lines without the door table, and the door table's lines."""
    if DOOR_TABLE not in lines:
        return lines, []
    start = lines.index(DOOR_TABLE)
    end = start + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    before = lines[:start]
    while before and not before[-1].strip():
        before.pop()
    return before + lines[end:], lines[start:end]


def _row(f: Figure) -> str:
    mark = "yes" if f.meets() else "NO"
    return f"| `{f.name}` | {f.value:g} | {f.bound or 'reported'} | {mark} | {f.description} |"


def merge_results(figures: list[Figure]) -> None:
    """Put the figures of the modules run alone into RESULTS.md: each one's row replaced where
    the table has it, else added at the end; the other rows as the last full run left them."""
    if not RESULTS.exists():
        write_results(figures, 0.0)
        return
    lines, old_table = _split_door_table(RESULTS.read_text(encoding="utf-8").splitlines())
    rows = {f"| `{f.name}` |": _row(f) for f in figures}
    merged = []
    for line in lines:
        head = next((key for key in rows if line.startswith(key)), None)
        merged.append(rows.pop(head) if head is not None else line)
    merged += rows.values()
    table = door_table(figures) or old_table
    merged += ["", *table] if table else []
    RESULTS.write_text("\n".join(merged) + "\n", encoding="utf-8")


def run_child(name: str) -> int:
    """Run one module here and print its figures as one JSON list."""
    module = importlib.import_module(f"bench.{name}")
    print(json.dumps([asdict(f) for f in module.run()]))
    return 0


def run_module(name: str) -> list[Figure]:
    """One module's figures, measured in a fresh interpreter."""
    print(f"running bench.{name} ...", file=sys.stderr)
    done = subprocess.run(
        [sys.executable, "-m", "bench", CHILD_FLAG, name], stdout=subprocess.PIPE, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"bench.{name} failed with exit code {done.returncode}")
    last = done.stdout.decode().strip().splitlines()[-1]
    return [Figure(**item) for item in json.loads(last)]


def main(argv: list[str]) -> int:
    if argv[:1] == [CHILD_FLAG]:
        return run_child(argv[1])
    names = argv or list(BENCHES)
    started = time.perf_counter()
    figures = [figure for name in names for figure in run_module(name)]
    if not argv:
        write_results(figures, time.perf_counter() - started)
    else:
        merge_results(figures)
    print(json.dumps({f.name: f.value for f in figures}))
    failed = [f.name for f in figures if not f.meets()]
    if failed:
        print(f"bounds not met: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
