"""Summaries stay within their room and bounded over many progressive cycles.

- ``summary_tokens_vs_room``: the largest summary written over the room it was planned for
  (``core.summaries.sizing.summary_limit``: the decision's room within the cap), over every
  summary of the shared SWE-agent, OpenHands and tau-bench runs replayed at 3.5k, 4k, 6k and 8k
  windows with the offline summarizer, and with a model summarizer (a stand-in server on
  127.0.0.1 answering with long summaries) at 4k and 8k.
- ``summary_growth_100_cycles``: a conversation compressed 100 times through the host API (a
  new span of messages each cycle, each summary merged into the last): its summary's tokens after
  100 cycles over its tokens after 10, with the offline summarizer and the model one.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import Figure
from bench.data import SOURCES, load
from recap.core.settings import Settings, load_settings
from recap.core.summaries import sizing

WINDOWS = (3_500, 4_000, 6_000, 8_000)
MODEL_WINDOWS = (4_000, 8_000)
CYCLES = 100
LONG_SUMMARY_ITEMS = 80  # the stand-in model's summaries: far over any small window's room


@contextmanager
def recorded() -> Iterator[list[tuple[int, int]]]:
    """(tokens, limit) of every summary the runs write while inside."""
    seen: list[tuple[int, int]] = []
    original = sizing.cut_summary

    def cut(text: str, limit: int, count: Callable[[str], int]) -> str:
        kept = original(text, limit, count)
        seen.append((count(kept), limit))
        return kept

    sizing.cut_summary = cut
    try:
        yield seen
    finally:
        sizing.cut_summary = original


def long_summary(body: dict[str, Any]) -> str:
    from tests.support.llm_server import stand_in_summary

    padding = "\n".join(
        f"- step {i}: " + " ".join(f"detail{i}_{j}" for j in range(20))
        for i in range(LONG_SUMMARY_ITEMS)
    )
    return stand_in_summary(body) + "\n## More\n" + padding


def replay_ratios(settings: Settings, windows: tuple[int, ...]) -> list[float]:
    from recap.workers import replay
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="ERROR")
    with recorded() as seen:
        for window in windows:
            for source in SOURCES:
                replay.replay_records(load(source), settings, window=window)
    return [tokens / limit for tokens, limit in seen]


def growth(settings: Settings) -> float:
    """Summary tokens after 100 cycles over after 10, through the host API."""
    from recap.core.client import Recap

    rng = random.Random(11)
    recap = Recap(settings, create_schema=True)
    cid = recap.new(model="gpt-4o", max_input_tokens=32_000)
    sizes: dict[int, int] = {}
    for cycle in range(1, CYCLES + 1):
        for step in range(3):
            words = " ".join(
                f"src/pkg{rng.randint(0, 999)}/mod{rng.randint(0, 99)}.py"
                if rng.random() < 0.08
                else f"w{rng.randint(0, 99_999)}"
                for _ in range(rng.randint(40, 160))
            )
            recap.add(cid, {"role": "user", "content": f"cycle {cycle}.{step}: {words}"})
            recap.add(cid, {"role": "assistant", "content": f"done {cycle}.{step}: {words[:300]}"})
        recap.compress(cid, force=True)
        summaries = recap.summaries(cid)
        if summaries:
            sizes[cycle] = summaries[-1].tokens
    return sizes[CYCLES] / sizes[10]


def run() -> list[Figure]:
    from tests.support.llm_server import LLMServer

    server = LLMServer(default=long_summary).start()
    try:
        offline = load_settings(summary_model=None)
        model = load_settings(
            summary_model="openai/gpt-4o-mini",
            summary_api_base=server.url,
            summary_api_key="sk-bench",
        )
        ratios = replay_ratios(offline, WINDOWS) + replay_ratios(model, MODEL_WINDOWS)
        with tempfile.TemporaryDirectory() as folder:
            growths = [
                growth(
                    s.model_copy(
                        update={
                            "database_url": f"sqlite:///{Path(folder) / f'g{i}.db'}",
                            "output_dir": Path(folder) / "outputs",
                        }
                    )
                )
                for i, s in enumerate((offline, model))
            ]
    finally:
        server.stop()
    return [
        Figure(
            "summary_tokens_vs_room",
            round(max(ratios), 3),
            "<= 1.0",
            f"the largest of {len(ratios)} summaries written in the shared runs (windows "
            f"{', '.join(map(str, WINDOWS))}; a model summarizer at "
            f"{', '.join(map(str, MODEL_WINDOWS))}) over the room it was planned for",
        ),
        Figure(
            "summary_growth_100_cycles",
            round(max(growths), 3),
            "<= 1.5",
            "a summary's tokens after 100 progressive cycles over after 10 (the larger of the "
            f"offline and the model summarizer: {growths[0]:.2f}, {growths[1]:.2f})",
        ),
    ]
