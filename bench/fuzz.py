"""The live-loop fuzz, full run: 500 seeded host sessions (``tests/support/livefuzz.py``).

Windows 2k-200k, a provider counting a constant 0.6-1.6x tiktoken whose reading is recorded after
a random share of requests, random system prompts and tools, the shared agent runs and generated
chats (tool outputs up to 3x the window, images, reasoning, edits, branches), with and without
compression after every turn. The suite runs a seeded subset (``tests/test_live_fuzz.py``).
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench import Figure
from tests.support import livefuzz

SESSIONS = 500
PROCESSES = 2  # sessions are independent counts, not timings: two at once
FIRST_SEED = 10_000  # apart from the suite's seeds


def _part(seeds: list[int]) -> livefuzz.Figures:
    with tempfile.TemporaryDirectory() as tmp:
        return livefuzz.run(Path(tmp), iter(seeds))


def run() -> list[Figure]:
    seeds = list(range(FIRST_SEED, FIRST_SEED + SESSIONS))
    total = livefuzz.Figures()
    with ProcessPoolExecutor(PROCESSES) as pool:
        for part in pool.map(_part, [seeds[i::PROCESSES] for i in range(PROCESSES)]):
            total.add(part)
    for line in total.failures[:20]:
        print(line, flush=True)
    where = f"{total.sessions} sessions, {total.requests} requests, {total.readings} readings"
    return [
        Figure(
            "fuzz_requests_over_window",
            total.over_window,
            "== 0",
            f"requests over the window by the provider's count once it was read ({where})",
        ),
        Figure(
            "fuzz_dead_ends",
            total.dead_ends,
            "== 0",
            "assemble failing after a compression though the system prompt, tools and last "
            "user message fit",
        ),
        Figure(
            "fuzz_silent_truncations",
            total.silent_truncations,
            "== 0",
            "messages neither sent, summarized, cleared nor reported as dropped",
        ),
        Figure(
            "fuzz_calibration_error",
            round(total.calibration_error, 4),
            "<= 0.05",
            "median |calibration factor - the provider's ratio| after three readings",
        ),
        Figure(
            "fuzz_truncated_requests",
            total.truncated_requests,
            "",
            "requests that left history out, reported (not a failure)",
        ),
    ]
