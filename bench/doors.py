"""Every door through the whole live loop (``tests/support/doors.py``): the same seeded sessions,
the same provider, through the Python API, `recap serve`'s chat completions, Responses and
Messages APIs, and the LangChain, Agents SDK and Pydantic AI adapters.

The provider counts by content (``tests/support/content_meter.py``: prose 1.0-1.15x cl100k,
code and JSON 1.3-1.7x, digit runs 2x, base64 1.7-2.0x, each session drawing its own rates) and
refuses a request over its window; a real ``recap worker`` compresses between turns. Each session
is a seed and a window (``SEEDS`` x ``WINDOWS``: 3k to 64k tokens, ``TURNS`` turns, and one
200k-window session of ``LARGEST_TURNS`` turns): user turns mixing prose, code, JSON and numbers,
some with a PNG screenshot (64, 512 or 1024 pixels square); tool calls whose JSON outputs (some
with base64 attachments) reach 3x the window (half the window in the 200k session, to keep it
fast); now and then a turn sent as an edit of the one before (the doors whose client can edit:
the Python API, serve's chat completions and Messages); every other seed streamed at the serve
doors. ``BENCH_DOORS_SEEDS`` sets how many seeds (12 by default: 60 sessions per door, 61 with
the 200k one).

Figures per door (and as a table by door in RESULTS.md): the model requests the provider
received, those over its window, the turns that failed (dead ends), the silent truncations (a
tool result sent changed without a note of Recap's, or an earlier turn missing from a request
with no summary or note, as the provider saw them), the share of requests whose usage was
recorded, and the calibration's error: p90 over every reading after a session's third of
|predicted / measured - 1|, by the rates per kind fitted over the readings before it. Over all
doors: the same added up, and (reported beside it) the error by the single factor of the reading
before each, as one factor per conversation would have planned.
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

SEEDS = tuple(range(101, 101 + int(os.environ.get("BENCH_DOORS_SEEDS", "12"))))
WINDOWS = (3_000, 6_000, 12_000, 24_000, 64_000)
TURNS = 4  # short sessions, so that 60 per door run in about half an hour on two cores
LARGEST = 200_000
LARGEST_TURNS = 3
DRAWS = [
    loop.Draw(seed, window, turns=TURNS, large=True, images=True, edits=True, stream=seed % 2 == 0)
    for seed in SEEDS
    for window in WINDOWS
] + [loop.Draw(SEEDS[0], LARGEST, turns=LARGEST_TURNS, images=True, edits=True)]


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
    where = (
        f"{len(DRAWS) - 1} sessions of {TURNS} turns at {', '.join(map(str, WINDOWS))} tokens "
        f"and one of {LARGEST_TURNS} at {LARGEST}"
    )
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
                f"doors_{door}_silent_truncations",
                f.silent_truncations,
                "== 0",
                f"{door}: results changed or turns missing without a note, as the provider saw",
            ),
            Figure(
                f"doors_{door}_calibration_error",
                round(p90(f.calibration_errors), 4),
                "<= 0.05",
                f"{door}: p90 of {len(f.calibration_errors)} readings after a session's third",
            ),
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
            "doors_silent_truncations",
            sum(f.silent_truncations for f in every),
            "== 0",
            "all doors",
        ),
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
