"""The limit of clearing (core.decision.cachecost.oracle): hand-priced tables, seeded random runs
against every schedule priced one by one, and real runs replayed under the schedule it finds."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from recap.core.decision.cachecost import (
    CACHED_PRICE,
    UNCACHED_PRICE,
    RunShape,
    following,
    keep_last_every_request,
    middle_step,
    never,
    oracle,
    oracle_cost,
    recap_policy,
    replay,
    shape_of,
    to_msgs,
)
from recap.core.decision.policy import Knobs

ENCODING = "o200k_base"
SEEDS = range(300)

# user 10, assistant 5, result A 100 (10 as a placeholder), assistant 5, result B 100 (10),
# assistant 5; requests end before positions 1, 3, 5 and 6.
TWO_RESULTS = RunShape(
    tokens=[10, 5, 100, 5, 100, 5], placeholder={2: 10, 4: 10}, results=[2, 4], ends=[1, 3, 5, 6]
)


@pytest.mark.parametrize(
    ("shape", "keep", "gap_keep", "cost", "cleared"),
    [
        # no result: 10 uncached, then 25 uncached and 10 cached
        (
            RunShape(tokens=[10, 5, 20, 5], placeholder={}, results=[], ends=[1, 3]),
            0,
            0,
            12.5 + 32.25,
            (0, 0),
        ),
        # a result may go as soon as it arrives when none is kept: no cached prefix is lost
        (
            RunShape(tokens=[10, 5, 100], placeholder={2: 10}, results=[2], ends=[1, 3]),
            0,
            0,
            12.5 + 19.75,
            (0, 1),
        ),
        # keep 1: A may go at the third request, before the fourth reads the shorter prefix
        (TWO_RESULTS, 1, 1, 12.5 + 132.25 + 145.25 + 19.25, (0, 0, 1, 1)),
        # keep 3: nothing may go
        (TWO_RESULTS, 3, 3, 12.5 + 132.25 + 142.75 + 28.25, (0, 0, 0, 0)),
    ],
)
def test_table(
    shape: RunShape, keep: int, gap_keep: int, cost: float, cleared: tuple[int, ...]
) -> None:
    """Hand-priced runs: the least cost and the schedule that reaches it."""
    found = oracle(shape, keep_last=keep, gap_keep_last=gap_keep)
    assert found.cost == pytest.approx(cost)
    assert found.cleared == cleared


def test_the_gap_is_where_clearing_is_free() -> None:
    """With the cache cold anyway at the gap, both results go there and not before."""
    shape = RunShape(**{**TWO_RESULTS.__dict__, "gap_at": 3})
    found = oracle(shape, keep_last=1, gap_keep_last=0)
    assert found.cleared == (0, 0, 0, 2)
    assert found.cost == pytest.approx(12.5 + 132.25 + 142.75 + 45 * UNCACHED_PRICE)


# --- every schedule, priced one by one -----------------------------------------------------------


def _limits(shape: RunShape, keep_last: int, gap_keep_last: int) -> list[int]:
    clearable = sorted(shape.placeholder)
    limits = []
    for step, end in enumerate(shape.ends):
        keep = gap_keep_last if step == shape.gap_at else keep_last
        sent = [r for r in shape.results if r < end]
        kept = set(sent[len(sent) - keep :]) if keep else set()
        if len(sent) <= keep:
            limits.append(0)
            continue
        first_kept = min(kept) if kept else end
        limits.append(len([p for p in clearable if p < first_kept]))
    return limits


def _schedules(limits: Sequence[int], start: int = 0) -> Iterator[tuple[int, ...]]:
    if not limits:
        yield ()
        return
    for count in range(start, max(start, limits[0]) + 1):
        for rest in _schedules(limits[1:], count):
            yield (count, *rest)


def _price(shape: RunShape, schedule: Sequence[int]) -> float:
    """A schedule's cost, request by request, as the replay prices it."""
    clearable = sorted(shape.placeholder)
    total = 0.0
    previous: list[tuple[int, bool]] = []
    for step, (end, count) in enumerate(zip(shape.ends, schedule, strict=True)):
        cleared = set(clearable[:count])
        sent = [(p, p in cleared) for p in range(end)]
        shared = 0
        if step and step != shape.gap_at:
            while shared < min(len(previous), len(sent)) and previous[shared] == sent[shared]:
                shared += 1
        counts = [shape.placeholder[p] if gone else shape.tokens[p] for p, gone in sent]
        cached = sum(counts[:shared])
        total += (sum(counts) - cached) * UNCACHED_PRICE + cached * CACHED_PRICE
        previous = sent
    return total


def _random_shape(rng: random.Random) -> RunShape:
    size = rng.randint(2, 9)
    tokens = [rng.randint(1, 60) for _ in range(size)]
    results = sorted(rng.sample(range(1, size), rng.randint(0, min(4, size - 1))))
    placeholder = {p: rng.randint(1, tokens[p] - 1) for p in results if tokens[p] > 1}
    placeholder = {p: v for p, v in placeholder.items() if rng.random() < 0.8}
    ends = sorted(rng.sample(range(1, size + 1), rng.randint(1, min(5, size))))
    gap = rng.choice([None, *range(len(ends))])
    return RunShape(tokens=tokens, placeholder=placeholder, results=results, ends=ends, gap_at=gap)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_runs_against_every_schedule(seed: int) -> None:
    """The oracle's cost is the least over every allowed schedule, and its schedule costs that."""
    rng = random.Random(seed)
    shape = _random_shape(rng)
    keep = rng.randint(0, 2)
    gap_keep = rng.randint(0, keep)
    found = oracle(shape, keep_last=keep, gap_keep_last=gap_keep)
    limits = _limits(shape, keep, gap_keep)
    least = min(_price(shape, schedule) for schedule in _schedules(limits))
    assert found.cost == pytest.approx(least)
    assert _price(shape, found.cleared) == pytest.approx(found.cost)
    assert found.cleared in set(_schedules(limits))


# --- real runs ---------------------------------------------------------------------------------


def _run(steps: int, size: int) -> list[dict[str, Any]]:
    """A user turn, then ``steps`` call/result pairs, then a final answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(steps):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "name": "bash",
             "content": f"output {i}: " + "lorem ipsum dolor " * (size * (i % 3 + 1))}
        )  # fmt: skip
    messages.append({"role": "assistant", "content": "Fixed."})
    return messages


@pytest.mark.parametrize(("steps", "size", "gap"), [(8, 200, True), (12, 50, False), (5, 5, True)])
def test_real_runs_replayed_under_the_oracle(steps: int, size: int, gap: bool) -> None:
    """Replayed under the oracle's schedule a run costs what the oracle says, and no less than
    under any policy of the same action space: never, keep-3 and Recap's own."""
    knobs = Knobs(keep_tool_results=3, idle_keep_tool_results=1)
    branch = to_msgs(_run(steps, size), ENCODING)
    gap_at = middle_step(branch) if gap else None
    limit = oracle_cost(branch, knobs, encoding=ENCODING, gap_at=gap_at)
    shape = shape_of(branch, encoding=ENCODING)
    replayed = replay(branch, following(branch, shape, limit), encoding=ENCODING, gap_at=gap_at)
    assert replayed.cost == pytest.approx(limit.cost)
    for policy in (never, keep_last_every_request(3), recap_policy(knobs, model="gpt-4o-mini")):
        assert replay(branch, policy, encoding=ENCODING, gap_at=gap_at).cost >= limit.cost - 1e-6


def test_what_is_worth_clearing() -> None:
    """A result whose placeholder would not be smaller, or of a protected tool, is never
    cleared: the same results ``plan_clearings`` leaves."""
    messages = _run(3, 100)
    messages[2]["content"] = "ok"
    branch = to_msgs(messages, ENCODING)
    assert sorted(shape_of(branch, encoding=ENCODING).placeholder) == [4, 6]
    assert shape_of(branch, encoding=ENCODING, protected=("BASH",)).placeholder == {}
