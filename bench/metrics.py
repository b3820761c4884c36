"""What Prometheus metrics cost `recap serve`: ``metrics_overhead``, the time to first byte of a
new stored turn (a 200-message conversation, one new message, the reply stored) through a serve
with ``RECAP_SERVE_METRICS=true`` over the same turn through one with metrics off, both against
the same model server, in rounds that alternate which goes first; the median of the rounds'
ratios.
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

ROUNDS = 51  # timed rounds per side (odd: the median is one of them)
WARMUP_ROUNDS = 3
BOUND = "<= 1.05"


def run() -> list[Figure]:
    history = long_conversation(load_all(), CONVERSATION)
    model = model_process()
    assert model.stdout is not None
    upstream = model.stdout.readline().decode().strip()
    try:
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            on_db, off_db = f"sqlite:///{root / 'on.db'}", f"sqlite:///{root / 'off.db'}"
            with (
                serve_process(on_db, upstream, root / "on", RECAP_SERVE_METRICS="true") as on,
                serve_process(off_db, upstream, root / "off") as off,
                httpx.Client(timeout=REQUEST_TIMEOUT) as client,
            ):
                measures = {  # the off side first in even rounds, the on side in odd ones
                    "off": Sides(client, off, upstream, history).new_turn,
                    "on": Sides(client, on, upstream, history).new_turn,
                }
                times = timed_rounds(measures, ROUNDS, WARMUP_ROUNDS)
                scraped = client.get(on.removesuffix("/v1") + "/metrics").text
    finally:
        model.terminate()
        model.wait()
    assert "recap_serve_turns_total" in scraped
    ms = {name: statistics.median(values) * 1000 for name, values in times.items()}
    # the median of each round's ratio: a round's two turns meet the same load on the machine
    ratio = statistics.median(on / off for on, off in zip(times["on"], times["off"], strict=True))
    return [
        Figure(
            "metrics_overhead",
            round(ratio, 3),
            BOUND,
            f"time to first byte of a new stored turn with RECAP_SERVE_METRICS=true "
            f"(median {ms['on']:.1f} ms) over metrics off ({ms['off']:.1f} ms): the median of "
            f"{ROUNDS} rounds' ratios, the order alternating",
        )
    ]
