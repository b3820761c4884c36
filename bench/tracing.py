"""What OpenTelemetry tracing costs `recap serve`: ``tracing_overhead``, the time to first byte
of a new stored turn (a 200-message conversation, one new message, the reply stored) through a
serve with ``RECAP_TRACING=true``, exporting its spans over OTLP/HTTP to a collector in this
process (the batch processor's defaults), over the same turn through one with tracing off (the
``recap[otel]`` packages installed, no provider set: the no-op path), both against the same
model server, in rounds that alternate which goes first; the median of the rounds' ratios.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import httpx

from bench import Figure
from bench.assemble import long_conversation
from bench.data import load_all
from bench.serve import model_process, serve_process
from bench.serve_turns import CONVERSATION, REQUEST_TIMEOUT, Sides, timed_rounds
from tests.support.otlp import collector
from tests.support.processes import wait_for

ROUNDS = 51  # timed rounds per side (odd: the median is one of them)
WARMUP_ROUNDS = 3
# Unlike the metrics' few counters, each span is a handful of SDK objects (tens of microseconds
# on a fast machine, a few hundred on a slow shared one), and a turn starts four of them before
# its first byte: a tenth more is the most a user should see.
BOUND = "<= 1.10"
EXPORT_TIMEOUT = 30.0  # seconds for the last batch (sent every 5 s by default) to arrive


def run() -> list[Figure]:
    history = long_conversation(load_all(), CONVERSATION)
    model = model_process()
    assert model.stdout is not None
    upstream = model.stdout.readline().decode().strip()
    try:
        with tempfile.TemporaryDirectory() as folder, collector() as traces:
            root = Path(folder)
            on_db, off_db = f"sqlite:///{root / 'on.db'}", f"sqlite:///{root / 'off.db'}"
            exporting = {
                "RECAP_TRACING": "true",
                "OTEL_EXPORTER_OTLP_ENDPOINT": traces.endpoint,
                "OTEL_SERVICE_NAME": "recap-serve-bench",
            }
            with (
                serve_process(on_db, upstream, root / "on", **exporting) as on,
                serve_process(off_db, upstream, root / "off") as off,
                httpx.Client(timeout=REQUEST_TIMEOUT) as client,
            ):
                measures = {  # the off side first in even rounds, the on side in odd ones
                    "off": Sides(client, off, upstream, history).new_turn,
                    "on": Sides(client, on, upstream, history).new_turn,
                }
                times = timed_rounds(measures, ROUNDS, WARMUP_ROUNDS)
                turns = WARMUP_ROUNDS + ROUNDS

                def exported() -> bool:  # every turn's request span reached the collector
                    return sum(s.kind == "SERVER" for s in list(traces.spans)) >= turns

                wait_for(exported, EXPORT_TIMEOUT, "the turns' spans at the collector")
    finally:
        model.terminate()
        model.wait()
    per_turn = len(traces.spans) / turns
    ms = {name: statistics.median(values) * 1000 for name, values in times.items()}
    ratio = statistics.median(on / off for on, off in zip(times["on"], times["off"], strict=True))
    return [
        Figure(
            "tracing_overhead",
            round(ratio, 3),
            BOUND,
            f"time to first byte of a new stored turn with RECAP_TRACING=true exporting over "
            f"OTLP/HTTP ({per_turn:.1f} spans a turn; median {ms['on']:.1f} ms) over tracing "
            f"off ({ms['off']:.1f} ms): the median of {ROUNDS} rounds' ratios, the order "
            f"alternating",
        )
    ]
