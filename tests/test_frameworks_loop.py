"""The whole live loop through the LangChain and Pydantic AI adapters (``tests/support/
framework_loop.py``): the real framework against a stand-in model server that counts tokens by
content and refuses a request over its window, a real ``recap worker`` between turns, seeded
sessions at small windows; the README's loop on the Python API runs the same sessions as the
reference.

No agent run fails, every model call's usage is recorded (the stored calibration moves off 1.0,
cached tokens among the readings), and no adapter sends more requests over the window than the
Python API does. Those few are turns whose new content (a large JSON tool output) counts at a
higher rate than the mix the calibration learned, by more than the safety margin: the provider
refuses them, and the adapter compresses and sends a smaller request once. The fast subset runs
two seeds at 3k and 6k windows per adapter; ``pytest -m slow`` runs the longer run (six
seeds, 20 turns, windows up to 32k).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from recap.core.client import Recap
from tests.support import doors
from tests.support import framework_loop as loop
from tests.support.frameworks_stack import FrameworkStack, host_on, start_stack

pytest.importorskip("langchain.agents", reason="the langchain extra is not installed")
pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

FAST = [loop.Draw(seed, window, turns=8) for seed in (1, 2) for window in (3_000, 6_000)]
LONG = [
    loop.Draw(seed, window, turns=20)
    for seed in range(3, 9)
    for window in (3_000, 6_000, 12_000, 32_000)
]
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrameworkStack]:
    running = start_stack(tmp_path_factory.mktemp("frameworks-loop"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def recap(stack: FrameworkStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recap]:
    """A host on the stack, its settings in the environment too (``compress_later`` reads the
    broker folder from there)."""
    with host_on(stack, monkeypatch) as host:
        yield host


ADAPTERS = {"langchain": doors.langchain_talk, "pydantic_ai": doors.pydantic_ai_talk}
REFERENCE = {"python_api": doors.python_api_talk}


def run(stack: FrameworkStack, recap: Recap, name: str, draws: list[loop.Draw]) -> loop.Figures:
    make = {**ADAPTERS, **REFERENCE}[name]
    total = loop.Figures()
    for draw in draws:
        total.add(asyncio.run(loop.run_session(stack, recap, make, draw, name)))
    return total


def check(figures: loop.Figures, draws: list[loop.Draw], reference: loop.Figures) -> None:
    """No failed run, every call's usage recorded and the calibration stored, cached tokens
    among the readings; no more requests over the window than the Python API's loop sent over
    the same sessions (one over the window is a turn whose new content counts at a higher
    rate than the calibrated mix: the provider refuses it, the retry goes through)."""
    shown = "\n".join(figures.failures[:12])
    assert figures.sessions == len(draws)
    assert figures.requests > figures.turns, shown  # tool steps ran
    assert figures.dead_ends == 0, shown
    assert figures.over_window <= reference.over_window, shown
    assert figures.readings >= figures.requests - figures.over_window, shown
    assert figures.cached_readings > 0, shown
    assert figures.uncalibrated == 0, shown


@pytest.fixture(scope="module")
def reference(stack: FrameworkStack, tmp_path_factory: pytest.TempPathFactory) -> loop.Figures:
    """The README's loop on the Python API over the fast sessions: the figures to match."""
    with pytest.MonkeyPatch.context() as patch, host_on(stack, patch) as host:
        return run(stack, host, "python_api", FAST)


def test_the_python_api_reference(reference: loop.Figures) -> None:
    """The reference itself: no failed run, at most one refused request per session."""
    shown = "\n".join(reference.failures[:12])
    assert reference.dead_ends == 0 and reference.readings > 0, shown
    assert reference.over_window <= reference.sessions, shown


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_the_adapter_runs_the_whole_loop(
    stack: FrameworkStack, recap: Recap, reference: loop.Figures, name: str
) -> None:
    """At 3k and 6k windows: no failed run, every call's usage recorded, no more requests over
    the window than the Python API's loop."""
    check(run(stack, recap, name, FAST), FAST, reference)


@slow
@pytest.mark.parametrize("name", sorted({**ADAPTERS, **REFERENCE}))
def test_the_loop_longer(stack: FrameworkStack, recap: Recap, name: str) -> None:
    """The longer run: six seeds, 20 turns, windows from 3k to 32k; the figures are printed."""
    figures = run(stack, recap, name, LONG)
    print(name, {k: v for k, v in vars(figures).items() if k != "failures"})
    print("\n".join(figures.failures))
    shown = "\n".join(figures.failures[:12])
    assert figures.dead_ends == 0, shown
    assert figures.readings >= figures.requests - figures.over_window, shown
    assert figures.uncalibrated == 0, shown
