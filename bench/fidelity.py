"""Live-host fidelity: replayed with the host's fixed parts, no request silently loses history.

Every conversation of the shared data is replayed through ``recap replay``'s pipeline
(``workers.replay``: messages added one by one, ``compress_session`` in process before each
request, the README's host loop on ``BudgetError``) with the fixed parts a live host sends: the
conversation's tool schemas (a representative set per source, since the data has none) and its
system prompt, at 8k, 16k and 32k windows. The decision is the production one
(``core.decision.policy.decide`` through ``workers.compress.compress_now``) in every run.

- ``silent_truncations_with_tools``: requests that left history out although the run before
  them had decided there was nothing to do (no summary written or under way).
- ``..._history_only``: the same replay with the decision blind to the request profile (it is
  forgotten before every run), so it plans with the stored history alone, as before
  ``assemble`` recorded what the host sends: today's figure beside the new one.
- ``request_over_window_measured``: a stand-in provider counts every request as tiktoken x 1.15
  (a tokenizer Recap's estimate undercounts) and its usage is recorded after each request; the
  requests it finds over the window, once calibration has had one turn of usage.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench import Figure
from bench.data import SOURCES, load
from recap.core.settings import load_settings

WINDOWS = (8_000, 16_000, 32_000)
MEASURED_WINDOWS = (8_000, 16_000)  # the tight windows: where an undercount would spill over
PROVIDER_FACTOR = 1.15  # the stand-in provider's tokenizer counts 15 % more than tiktoken
PROCESSES = 2  # replays are independent counts, not timings: run two at once


@dataclass(frozen=True)
class Job:
    """One replay of one source."""

    source: str
    window: int
    profile_blind: bool = False
    provider_factor: float | None = None


def replay_one(job: Job) -> dict[str, Any]:
    """The totals of one source replayed as ``job`` says, offline (the extractive summarizer)."""
    from recap.workers import replay
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="ERROR")  # the runs' own lines are not figures
    host = replay.Host(profile_blind=job.profile_blind, provider_factor=job.provider_factor)
    settings = load_settings(summary_model=None)
    report = replay.replay_records(load(job.source), settings, window=job.window, host=host)
    return dict(report["total"])


def jobs() -> list[Job]:
    """Every replay the figures need."""
    planned = [Job(s, w) for w in WINDOWS for s in SOURCES]
    planned += [Job(s, w, profile_blind=True) for w in WINDOWS for s in SOURCES]
    planned += [
        Job(s, w, provider_factor=PROVIDER_FACTOR) for w in MEASURED_WINDOWS for s in SOURCES
    ]
    return planned


def run() -> list[Figure]:
    planned = jobs()
    with ProcessPoolExecutor(max_workers=PROCESSES) as pool:
        totals = dict(zip(planned, pool.map(replay_one, planned), strict=True))

    def total(key: str, *, blind: bool = False, measured: bool = False) -> int:
        return sum(
            int(t[key])
            for job, t in totals.items()
            if job.profile_blind == blind and (job.provider_factor is not None) == measured
        )

    requests = total("requests")
    windows = "8k, 16k and 32k"
    return [
        Figure(
            "silent_truncations_with_tools",
            total("silent_truncations"),
            "== 0",
            f"requests that left history out with no summary written or under way, over the "
            f"{requests} requests of the shared data at {windows} windows, tools and system "
            f"prompt passed to assemble ({total('truncations')} truncations in all)",
        ),
        Figure(
            "silent_truncations_with_tools_history_only",
            total("silent_truncations", blind=True),
            "",
            "the same replay with the decision blind to the request profile (history alone, "
            "as before assemble recorded the host's fixed parts)",
        ),
        Figure(
            "requests_too_large_with_tools",
            total("errors"),
            "",
            "requests that could not be sent even after compressing now: the newest step alone "
            "(one tool output) is larger than the room the window leaves beside the tools",
        ),
        Figure(
            "request_over_window_measured",
            total("over_window_measured", measured=True),
            "== 0",
            f"requests a provider counting tiktoken x {PROVIDER_FACTOR} finds over the window "
            f"once record_usage has calibrated one turn ({total('requests', measured=True)} "
            "requests at 8k and 16k)",
        ),
    ]
