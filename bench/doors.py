"""Every door through the whole live loop (``tests/support/doors.py``): the same seeded sessions,
the same provider, through the Python API, `recap serve`'s chat completions, Responses and
Messages APIs, and the LangChain, Agents SDK and Pydantic AI adapters.

The provider counts by content (``tests/support/content_meter.py``: prose 1.0-1.15x cl100k,
code and JSON 1.3-1.7x, digit runs 2x, base64 1.7-2.0x, each session drawing its own rates) and
refuses a request over its window; a real ``recap worker`` compresses between turns. Each session
is a seed and a window (3k, 6k and 24k tokens): user turns mixing prose, code, JSON and numbers,
tool calls whose JSON outputs (some with base64 attachments) reach half the window.

Figures per door: the model requests the provider received, those over its window, the turns
that failed (dead ends), and the share of requests whose usage was recorded. Over all doors: the
calibration's error, p90 over every reading after a session's third of |predicted / measured -
1|, by the rates per kind fitted over the readings before it, and (reported beside it) by the
single factor of the reading before it, as one factor per conversation would have planned.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench import Figure
from tests.support import doors
from tests.support import framework_loop as loop
from tests.support.frameworks_stack import start_stack

SEEDS = (101, 102)
WINDOWS = (3_000, 6_000, 24_000)
TURNS = 20
DRAWS = [loop.Draw(seed, window, turns=TURNS) for seed in SEEDS for window in WINDOWS]


def p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=10, method="inclusive")[8]


def _measure(folder: Path) -> dict[str, loop.Figures]:
    from recap.core.client import Recap
    from recap.core.settings import get_settings
    from recap.workers import enqueue

    stack = start_stack(folder / "stack")
    saved = dict(os.environ)
    try:
        os.environ.update(stack.host_env())
        get_settings.cache_clear()
        enqueue.reset()
        results = {}
        with doors.serves(stack, folder / "serve") as running:
            for door in doors.DOORS:
                recap = Recap(get_settings())
                try:
                    results[door] = doors.run_door(stack, recap, door, DRAWS, running)
                finally:
                    recap.engine.dispose()
                figures = results[door]
                shown = {k: v for k, v in vars(figures).items() if not isinstance(v, list)}
                print(door, shown, file=sys.stderr)
                for line in figures.failures[:5]:
                    print("  ", line, file=sys.stderr, flush=True)
        return results
    finally:
        os.environ.clear()
        os.environ.update(saved)
        enqueue.reset()
        stack.stop()


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        results = _measure(Path(tmp))
    where = f"{len(DRAWS)} sessions of {TURNS} turns at {', '.join(map(str, WINDOWS))} tokens"
    figures: list[Figure] = []
    for door, f in results.items():
        recorded = f.readings / f.requests if f.requests else 0.0
        figures += [
            Figure(f"doors_{door}_requests", f.requests, "", f"{door}: model requests ({where})"),
            Figure(
                f"doors_{door}_over_window",
                f.over_window,
                "== 0",
                f"{door}: requests over the window by the provider's count",
            ),
            Figure(f"doors_{door}_dead_ends", f.dead_ends, "== 0", f"{door}: failed turns"),
            Figure(
                f"doors_{door}_usage_recorded",
                round(recorded, 3),
                ">= 1",
                f"{door}: usage readings stored / model requests",
            ),
        ]
    every = list(results.values())
    kinds_errors = [e for f in every for e in f.calibration_errors]
    single_errors = [e for f in every for e in f.single_factor_errors]
    figures += [
        Figure(
            "doors_requests_over_window",
            sum(f.over_window for f in every),
            "== 0",
            f"all doors: requests over the window ({len(every)} doors x {len(DRAWS)} sessions)",
        ),
        Figure("doors_dead_ends", sum(f.dead_ends for f in every), "== 0", "all doors"),
        Figure(
            "doors_calibration_error",
            round(p90(kinds_errors), 4),
            "<= 0.05",
            f"p90 |predicted / measured - 1| of {len(kinds_errors)} readings after a session's "
            "third, by the rates per kind of content fitted over the readings before each",
        ),
        Figure(
            "doors_calibration_error_single_factor",
            round(p90(single_errors), 4),
            "",
            "the same readings predicted by the single factor of the reading before each",
        ),
    ]
    return figures
