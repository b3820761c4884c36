"""The budget and the decision as tables of plain values (core.counting.budget,
core.decision.policy)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from recap.core.counting import budget
from recap.core.decision import policy
from recap.core.storage.profile import FixedParts, Profile
from recap.core.summaries.planning import message_tokens
from recap.core.values.records import ClearingRec, Msg, SummaryRec

NOW = datetime(2026, 1, 1, tzinfo=UTC)
KNOBS = policy.Knobs(keep_turns=0, recent_min_tokens=200, min_summary_span_tokens=100)


# --- the budget ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "margin", "reserve", "fixed", "factor", "usable", "whole", "available"),
    [
        (10_000, 0.05, 0, 0, 1.0, 9_500, 9_500, 9_500),
        (10_000, 0.05, 1_000, 0, 1.0, 8_500, 8_500, 8_500),  # the reply's room
        (10_000, 0.05, 1_000, 3_700, 1.0, 8_500, 8_500, 4_800),  # tools and system
        (10_000, 0.0, 0, 1_000, 1.25, 10_000, 8_000, 8_750),  # a provider counting more
        (10_000, 0.0, 0, 0, 9.0, 10_000, 5_000, 10_000),  # the factor is clamped to 2
    ],
)
def test_request_budget(
    window: int,
    margin: float,
    reserve: int,
    fixed: int,
    factor: float,
    usable: int,
    whole: int,
    available: int,
) -> None:
    """available = window x (1 - margin) - fixed - reserve, in provider tokens."""
    plan = budget.request_budget(
        window, safety_margin=margin, output_reserve=reserve, fixed=fixed, calibration=factor
    )
    assert (plan.usable, plan.request, plan.available) == (usable, whole, available)


@pytest.mark.parametrize(
    ("entry", "given", "setting", "override", "expected"),
    [
        ({"max_input_tokens": 128_000, "max_output_tokens": 16_384}, False, 4_096, None, 4_096),
        ({"max_input_tokens": 8_192, "max_output_tokens": 1_024}, False, 4_096, None, 1_024),
        ({"max_input_tokens": 8_192}, False, 4_096, None, 4_096),  # no max output known
        ({"max_input_tokens": 128_000, "max_output_tokens": 16_384}, True, 4_096, None, 0),
        ({"max_input_tokens": 128_000, "max_output_tokens": 16_384}, False, 4_096, 0, 0),
        (None, True, 4_096, 2_000, 2_000),  # the conversation's override wins
    ],
)
def test_output_reserve(
    entry: dict[str, Any] | None, given: bool, setting: int, override: int | None, expected: int
) -> None:
    """Map windows are shared with the reply; a window the host gives is for input alone."""
    reserve = budget.output_reserve(entry, window_given=given, setting=setting, override=override)
    assert reserve == expected


@pytest.mark.parametrize(
    ("reading", "leaf", "now", "factor"),
    [
        (None, 10, NOW, 1.0),
        (budget.Reading(estimated=1_000, measured=1_150, leaf_id=10, at=NOW), 10, NOW, 1.15),
        (
            budget.Reading(estimated=1_000, measured=1_150, leaf_id=10, at=NOW),
            200,
            NOW,
            1.15,
        ),  # a few turns on: kept
        (
            budget.Reading(estimated=1_000, measured=1_150, leaf_id=10, at=NOW),
            10 + 1_100,
            NOW,
            1.075,
        ),  # half-way to far
        (
            budget.Reading(estimated=1_000, measured=1_150, leaf_id=10, at=NOW),
            10 + 5_000,
            NOW,
            1.0,
        ),  # far: ignored
        (
            budget.Reading(estimated=1_000, measured=1_150, leaf_id=10, at=NOW - timedelta(days=4)),
            10,
            NOW,
            1.075,
        ),  # stale
        (
            budget.Reading(
                estimated=1_000, measured=1_150, leaf_id=10, at=NOW - timedelta(days=30)
            ),
            10,
            NOW,
            1.0,
        ),
        (
            budget.Reading(estimated=1_000, measured=9_000, leaf_id=10, at=NOW),
            10,
            NOW,
            2.0,
        ),  # clamped
    ],
)
def test_calibration_decays(
    reading: budget.Reading | None, leaf: int, now: datetime, factor: float
) -> None:
    """The factor is clamped and drawn back to 1 as the reading ages or the leaf moves on."""
    assert budget.calibration_factor(reading, leaf_id=leaf, now=now) == pytest.approx(factor)


# --- the decision ----------------------------------------------------------------------------


def chat(turns: int, size: int = 100) -> list[Msg]:
    messages = [Msg(1, None, "system", None, 20)]
    for _ in range(turns):
        for role in ("user", "assistant"):
            mid = len(messages) + 1
            messages.append(Msg(mid, mid - 1, role, None, size))
    return messages


def agent(steps: int, result: int = 200) -> list[Msg]:
    """One user message and ``steps`` tool steps (a call and its result each)."""
    messages = [Msg(1, None, "user", None, 50)]
    for _ in range(steps):
        mid = len(messages) + 1
        call = ({"id": "call_0", "function": {"name": "run"}},)  # reused id, as some servers do
        messages.append(Msg(mid, mid - 1, "assistant", None, 30, tool_calls=call))
        messages.append(Msg(mid + 1, mid, "tool", None, result, tool_call_id="call_0", name="run"))
    return messages


def snap(
    branch: list[Msg],
    *,
    window: int = 10_000,
    parts: FixedParts | None = None,
    reading: budget.Reading | None = None,
    summary: SummaryRec | None = None,
    clearings: dict[int, ClearingRec] | None = None,
    failures: tuple[policy.Failure, ...] = (),
) -> policy.Snapshot:
    profile = Profile(
        parts=parts, content_hash="h" if parts else None, reserve_override=None, reading=reading
    )
    return policy.Snapshot(
        conversation_id="c",
        model="gpt-4o-mini",
        window_override=window,
        branch=branch,
        summary=summary,
        clearings=clearings or {},
        profile=profile,
        now=NOW,
        failures=failures,
    )


def test_the_host_s_tools_count() -> None:
    """The case that went wrong: a 7,600-token window, 3.7k tokens of tool schemas given to
    assemble. History alone (4,491) is under a trigger of history alone (5,415), but with the
    profile the decision summarizes before assemble would have to drop history."""
    branch = chat(22)  # 4,400 tokens of history and a stored system prompt
    alone = policy.decide(snap(branch, window=7_600), KNOBS)
    assert alone.action == policy.SKIP
    tools = FixedParts(system=20, tools=3_700)
    seen = policy.decide(snap(branch, window=7_600, parts=tools), KNOBS)
    assert seen.action == policy.SUMMARIZE and seen.urgent
    assert seen.pressure.available == 7_220 - 3_720 - 3


@pytest.mark.parametrize(
    ("turns", "reading", "action"),
    [
        (10, None, policy.SKIP),  # 2,000 of 7,107 tokens
        (35, None, policy.SKIP),  # 7,000: just under the trigger
        (36, None, policy.SUMMARIZE),  # 7,200: over it
        (
            35,
            budget.Reading(estimated=1_000, measured=1_150, leaf_id=71, at=NOW),
            policy.SUMMARIZE,
        ),  # 8,050 measured
    ],
)
def test_trigger_uses_calibration(turns: int, reading: budget.Reading | None, action: str) -> None:
    """The estimate is scaled by the provider's reading before it meets the trigger."""
    decision = policy.decide(snap(chat(turns), reading=reading), KNOBS)
    assert decision.action == action, decision.reason


def test_urgent_skips_the_gate_and_the_rest() -> None:
    """Below the urgent ratio failures rest the summarizer and a small clearing waits for
    clear_at_least; at or above it (0.95 of the room) neither holds the run back."""
    failures = tuple(policy.Failure(NOW - timedelta(minutes=1), "boom") for _ in range(3))
    calm = policy.decide(snap(chat(36), failures=failures), KNOBS)  # 7,200 of 9,477
    assert calm.action == policy.REST and not calm.urgent
    urgent = policy.decide(snap(chat(46), failures=failures), KNOBS)  # 9,200 of 9,477
    assert urgent.urgent and urgent.action == policy.SUMMARIZE
    small = policy.decide(snap(agent(34, result=100), window=6_000), KNOBS)
    assert not small.urgent and small.clear is None  # the saving is under 2,000 tokens
    pressed = policy.decide(snap(agent(42, result=100), window=6_000), KNOBS)
    assert pressed.urgent and pressed.clear  # any saving is worth it now


def test_a_does_not_reduce_rejection_is_no_failure() -> None:
    """A summary rejected for not being smaller does not count towards the streak."""
    rejected = policy.Failure(
        NOW, "summary rejected: the summary (90 tokens) does not reduce the 60"
    )
    real = policy.Failure(NOW, "the summarizer failed: 500")
    assert not rejected.counts and real.counts
    branch = chat(40)
    resting = policy.decide(snap(branch, failures=(real, real, real)), KNOBS)
    assert resting.action == policy.REST
    running = policy.decide(snap(branch, failures=(rejected, real, rejected, real)), KNOBS)
    assert running.action == policy.SUMMARIZE


def test_minimum_span_is_never_sent() -> None:
    """A span under the minimum is not sent to the summarizer: the decision skips and says why."""
    branch = chat(40)
    knobs = policy.Knobs(keep_turns=0, recent_min_tokens=200, min_summary_span_tokens=10**6)
    decision = policy.decide(snap(branch), knobs)
    assert decision.action == policy.SKIP and "smallest span" in decision.reason
    assert policy.decide(snap(branch), KNOBS).action == policy.SUMMARIZE


def test_one_agent_turn_is_cut_at_a_step_boundary() -> None:
    """One user message and many steps: the cut falls before an assistant step, never between
    a call and its result, and what stays fits the recent budget."""
    decision = policy.decide(snap(agent(200), window=16_000), KNOBS)
    assert decision.action == policy.SUMMARIZE and decision.split is not None
    split = decision.split
    assert split.recent[0].role == "assistant" and split.older[-1].role == "tool"
    kept = sum(message_tokens(m, decision.clearings) for m in split.recent)
    assert kept <= policy.recent_budget(decision.pressure, KNOBS)[0]


def test_clearing_first_when_it_is_enough() -> None:
    """Old tool results are cleared when that alone brings the history under the trigger."""
    decision = policy.decide(snap(agent(22, result=400), window=12_000), KNOBS)
    assert decision.action == policy.CLEAR and decision.clear
    assert decision.clear.tokens_reclaimed >= KNOBS.clear_at_least_tokens


def test_force_summarizes_under_the_trigger() -> None:
    """A forced run summarizes whatever the pressure, without clearing first."""
    decision = policy.decide(snap(chat(12)), KNOBS, force=True)
    assert decision.action == policy.SUMMARIZE and decision.clear is None


def test_over_the_room_the_decision_cuts_deeper() -> None:
    """The "why" case: pressure over 1 with a span under the smallest worth summarizing at the
    usual recent budget (keep-turns, a quarter of the room): the decision cuts deeper (one
    turn kept, half the recent budget) instead of skipping a conversation that no longer fits."""
    knobs = policy.Knobs(keep_turns=3, recent_min_tokens=2_000, min_summary_span_tokens=4_500)
    branch = chat(14, size=200)  # 5,600 tokens of history in a 5,000-token window
    decision = policy.decide(snap(branch, window=5_000), knobs)
    assert decision.pressure.ratio > 1
    assert decision.action == policy.SUMMARIZE, decision.reason
    assert decision.split is not None and decision.split.summary_room is not None


def test_the_summary_is_planned_for_the_room_it_leaves() -> None:
    """The summary's room is half of what the trigger leaves beside the recent part."""
    decision = policy.decide(snap(chat(36)), KNOBS)
    split = decision.split
    assert split is not None and split.summary_room is not None
    recent = sum(message_tokens(m, decision.clearings) for m in split.recent)
    assert split.summary_room == max((decision.pressure.trigger - recent) // 2, 256)


def steps_of_sizes(sizes: list[int]) -> list[Msg]:
    """One user message and a tool step per size (its result that large)."""
    messages = [Msg(1, None, "user", None, 50)]
    for size in sizes:
        mid = len(messages) + 1
        call = ({"id": "call_0", "function": {"name": "run"}},)
        messages.append(Msg(mid, mid - 1, "assistant", None, 30, tool_calls=call))
        messages.append(Msg(mid + 1, mid, "tool", None, size, tool_call_id="call_0", name="run"))
    return messages


@pytest.mark.parametrize(
    ("name", "sizes", "cleared_before", "window", "action"),
    [
        # the first clearing under pressure: cheapest loss first, whatever it rewrites
        ("first clearing", [400] * 22, 0, 12_000, policy.CLEAR),
        # results already taken, the history back at the trigger: clearing again starts near
        # the front and rewrites most of the cached prefix for a few turns' room
        ("again, from the front", [400] * 40, 6, 12_000, policy.SUMMARIZE),
        ("again, many small", [100] * 25 + [2500] * 5, 25, 16_000, policy.SUMMARIZE),
        # one large result near the end: ageing it rewrites little for much room
        (
            "again, one large near the end",
            [100] * 10 + [7000] + [300] * 3,
            10,
            12_000,
            policy.CLEAR,
        ),
    ],
)
def test_a_clearing_again_is_weighed_against_a_summary_by_what_each_rewrites(
    name: str, sizes: list[int], cleared_before: int, window: int, action: str
) -> None:
    branch = steps_of_sizes(sizes)
    results = [m for m in branch if m.role == "tool"][:cleared_before]
    clearings = {
        m.id: ClearingRec(
            message_id=m.id, reason="pressure", tokens_reclaimed=m.tokens - 20, stage="cleared"
        )
        for m in results
    }
    decision = policy.decide(snap(branch, window=window, clearings=clearings), KNOBS)
    assert decision.action == action, (name, decision.reason)
    if action == policy.SUMMARIZE:
        assert "summarized instead" in decision.reason
        assert decision.clear is None  # the clearing it weighed is not taken as well
