"""The aged stage as tables of plain values and seeded random lifecycles (core.decision,
core.request): a tool result goes full -> aged -> cleared (or straight to cleared), never back;
old tool-call arguments are shortened only beyond the last N calls; an aged result is sent within
its character cap and never above the size its clearing recorded, so a request's count stays
exact: what it reports is the recount of what it sends plus, message by message, what each
recorded size leaves unused."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from recap.core.counting import tokens
from recap.core.decision import policy
from recap.core.decision.toolresults import (
    IDLE,
    POST_SUMMARY,
    PRESSURE,
    aged_reclaimable,
    aged_tokens_bound,
    argument_saving,
    plan_clearings,
    reclaimable,
    shortened_call,
)
from recap.core.errors import BudgetError
from recap.core.request import shorten
from recap.core.request.placeholders import aged_note
from recap.core.request.timeline import AGED as AGED_STATE
from recap.core.request.timeline import CLEARED as CLEARED_STATE
from recap.core.request.timeline import FULL, derive
from recap.core.values.clearing import ClearingPlan, PlannedClearing, describe_steps
from recap.core.values.records import (
    AGED,
    ARGUMENTS,
    CLEARED,
    ClearingRec,
    Msg,
    merge_step,
    steps_of,
)
from tests.support.assembling import assemble
from tests.test_assembly import check_request

MODEL = "gpt-4o-mini"
ENCODING = tokens.encoding_name_for(MODEL)
NOW = datetime(2026, 1, 1, tzinfo=UTC)
CAP = 4_000
AGED_MARK = "characters of this output are left out here to save context"
WORDS = ("alpha", "beta", "src/app.py", "ValueError:", "42", '{"k": 1}', "日本語", "😀", "  ")


# --- building branches -------------------------------------------------------------------------


def output(rng: random.Random, lines: int, tag: str) -> str:
    """A tool output of ``lines`` lines, each starting with ``tag``."""
    return "\n".join(
        f"{tag} {i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 14)))
        for i in range(lines)
    )


class Builder:
    """A branch grown message by message, counted as on import."""

    def __init__(self) -> None:
        self.branch: list[Msg] = []

    def add(self, message: dict[str, Any], **fields: Any) -> Msg:
        mid = len(self.branch) + 1
        stored = Msg(
            id=mid,
            parent_id=self.branch[-1].id if self.branch else None,
            role=message["role"],
            content=message.get("content"),
            tokens=tokens.count_message(message, ENCODING),
            tool_calls=tuple(message.get("tool_calls") or ()),
            tool_call_id=message.get("tool_call_id"),
            name=message.get("name"),
            **fields,
        )
        self.branch.append(stored)
        return stored

    def step(
        self,
        text: str,
        *,
        tool: str = "bash",
        arguments: str = "{}",
        path: str | None = None,
        calls: int = 1,
    ) -> tuple[Msg, list[Msg]]:
        """An assistant message calling ``tool`` ``calls`` times and the results."""
        start = len(self.branch) + 1
        ids = [f"call_{start}_{k}" for k in range(calls)]
        specs = [
            {"id": cid, "type": "function", "function": {"name": tool, "arguments": arguments}}
            for cid in ids
        ]
        call = self.add({"role": "assistant", "content": None, "tool_calls": specs})
        results = [
            self.add(
                {"role": "tool", "tool_call_id": cid, "name": tool, "content": text},
                output_path=path,
            )
            for cid in ids
        ]
        return call, results


def agent(sizes: list[int], *, arguments: str = "{}", seed: int = 0) -> list[Msg]:
    """A user turn, then one step per size (an output of that many lines)."""
    rng = random.Random(seed)
    built = Builder()
    built.add({"role": "user", "content": "fix the failing test"})
    for k, lines in enumerate(sizes):
        built.step(output(rng, lines, f"r{k}"), arguments=arguments)
    return built.branch


def results_of(branch: list[Msg]) -> list[Msg]:
    return [m for m in branch if m.role == "tool"]


def aged_rec(message: Msg, cap: int = CAP) -> ClearingRec:
    return merge_step(None, message.id, PRESSURE, aged_reclaimable(message, cap), AGED, cap)


def cleared_rec(message: Msg) -> ClearingRec:
    return merge_step(None, message.id, IDLE, reclaimable(message))


# --- one step at a time ----------------------------------------------------------------------

BIG, SMALL = 400, 3  # lines of an output well over the aged cap, and of one under it


@pytest.mark.parametrize(
    ("lines", "before", "stage", "after"),
    [
        (BIG, None, AGED, AGED),  # full -> aged
        (BIG, None, CLEARED, CLEARED),  # full -> cleared directly
        (BIG, "aged", CLEARED, CLEARED),  # aged -> cleared
        (BIG, "aged", AGED, None),  # aged already
        (BIG, "cleared", AGED, None),  # never back from cleared to aged
        (BIG, "cleared", CLEARED, None),  # cleared already
        (BIG, "shortened", AGED, None),  # a result sent shortened stays so
        (SMALL, None, AGED, None),  # under the cap: ageing would save nothing, it stays full
        (40, None, CLEARED, CLEARED),  # ... until it is cleared
    ],
)
def test_one_step_of_a_result(
    lines: int, before: str | None, stage: str, after: str | None
) -> None:
    """What ``plan_clearings`` does with the oldest result (four steps, the last three kept)."""
    branch = agent([lines, BIG, BIG, BIG])
    oldest = results_of(branch)[0]
    prior = {
        None: None,
        "aged": aged_rec(oldest),
        "cleared": cleared_rec(oldest),
        "shortened": merge_step(None, oldest.id, shorten.SHORTENED, oldest.tokens - 500),
    }[before]
    clearings = {} if prior is None else {oldest.id: prior}
    plan = plan_clearings(
        branch,
        clearings,
        keep_last=3,
        protected=(),
        min_tokens=1,
        reason=PRESSURE,
        stage=stage,
        aged_chars=CAP,
    )
    assert [item.message_id for item in plan] == ([] if after is None else [oldest.id])
    if after is None:
        return
    item = plan.items[0]
    assert item.stage == after
    if after == AGED:
        assert item.tokens_reclaimed == oldest.tokens - aged_tokens_bound(oldest, CAP)
        assert item.kept_chars == CAP and item.saves == item.tokens_reclaimed
    elif prior is not None:  # aged -> cleared: the step saves what the placeholder adds
        assert item.tokens_reclaimed == reclaimable(oldest)
        assert item.saves == reclaimable(oldest) - prior.tokens_reclaimed > 0
    else:
        assert item.saves == item.tokens_reclaimed == reclaimable(oldest)


def test_the_last_results_and_protected_tools_are_left_full() -> None:
    """The candidates are the same for both stages: not the last ``keep_last`` results, not a
    protected tool's."""
    branch = agent([BIG] * 6)
    protected = results_of(branch)[1]
    branch[branch.index(protected)] = protected._replace(name="todo_write")
    for stage in (AGED, CLEARED):
        plan = plan_clearings(
            branch,
            {},
            keep_last=2,
            protected=("TODO_WRITE",),
            min_tokens=1,
            reason=PRESSURE,
            stage=stage,
            aged_chars=CAP,
        )
        expected = [m.id for i, m in enumerate(results_of(branch)[:4]) if i != 1]
        assert plan.message_ids == expected and {item.stage for item in plan} == {stage}


def test_the_gate_counts_every_stage_together() -> None:
    """A plan under ``min_tokens`` is empty, ageing and arguments counted together."""
    branch = agent([BIG, BIG, BIG, BIG])
    kwargs: dict[str, Any] = {"keep_last": 3, "protected": (), "reason": PRESSURE}
    aged = plan_clearings(branch, {}, min_tokens=1, stage=AGED, aged_chars=CAP, **kwargs)
    saved = aged.tokens_reclaimed
    assert plan_clearings(branch, {}, min_tokens=saved, stage=AGED, aged_chars=CAP, **kwargs)
    assert not plan_clearings(
        branch, {}, min_tokens=saved + 1, stage=AGED, aged_chars=CAP, **kwargs
    )
    with pytest.raises(ValueError, match="aged or cleared"):
        plan_clearings(branch, {}, min_tokens=1, stage=ARGUMENTS, **kwargs)


# --- old arguments -----------------------------------------------------------------------------

LONG = json.dumps({"path": "src/app.py", "content": "x = 1\n" * 120})
SHORT = json.dumps({"path": "src/app.py"})


@pytest.mark.parametrize(
    ("arguments", "keep", "expected"),
    [
        ([LONG] * 5, 2, [0, 1, 2]),  # beyond the last two calls
        ([LONG] * 5, 0, [0, 1, 2, 3, 4]),
        ([LONG] * 5, 5, []),
        ([SHORT, LONG, SHORT, LONG, LONG], 1, [1, 3]),  # short ones have nothing to shorten
        (["[" + ",".join(["1"] * 200) + "]"] + [LONG] * 2, 0, [1, 2]),  # other JSON stays whole
        (["plain text " * 40] + [LONG] * 2, 2, [0]),  # text is text
    ],
)
def test_arguments_only_beyond_the_last_calls(
    arguments: list[str], keep: int, expected: list[int]
) -> None:
    """Which calls' arguments a plan shortens; each saves what its tokens say, at least."""
    built = Builder()
    built.add({"role": "user", "content": "go"})
    calls = [built.step("ok", arguments=a)[0] for a in arguments]
    plan = plan_clearings(
        built.branch,
        {},
        keep_last=10,
        protected=(),
        min_tokens=1,
        reason=PRESSURE,
        stage=AGED,
        aged_chars=CAP,
        keep_arguments=keep,
    )
    assert plan.message_ids == [calls[i].id for i in expected]
    for item in plan:
        assert item.stage == ARGUMENTS and item.tokens_reclaimed == argument_saving(
            next(m for m in built.branch if m.id == item.message_id)
        )
    again = policy.with_plan({}, plan)
    assert not plan_clearings(
        built.branch,
        again,
        keep_last=10,
        protected=(),
        min_tokens=1,
        reason=PRESSURE,
        stage=AGED,
        aged_chars=CAP,
        keep_arguments=keep,
    ), "arguments are shortened once"


def test_arguments_of_a_message_with_newer_calls_or_a_protected_tool_stay() -> None:
    """A message whose calls straddle the boundary, or that calls a protected tool, keeps its
    arguments; without the aged stage (``aged_chars`` 0) none are shortened."""
    built = Builder()
    built.add({"role": "user", "content": "go"})
    old, _ = built.step("ok", arguments=LONG)
    straddling, _ = built.step("ok", arguments=LONG, calls=3)
    built.step("ok", arguments=LONG, tool="update_plan")
    built.step("ok", arguments=LONG)
    common: dict[str, Any] = {"keep_last": 10, "min_tokens": 1, "reason": PRESSURE, "stage": AGED}
    plan = plan_clearings(
        built.branch, {}, protected=("update_plan",), aged_chars=CAP, keep_arguments=1, **common
    )
    assert plan.message_ids == [old.id, straddling.id]
    plan = plan_clearings(
        built.branch, {}, protected=("update_plan",), aged_chars=CAP, keep_arguments=3, **common
    )
    assert plan.message_ids == [old.id]  # the newest 3 calls include one of the second message's
    assert not plan_clearings(
        built.branch, {}, protected=(), aged_chars=0, keep_arguments=0, **common
    )


def test_a_shortened_call_stays_valid_json_and_names_its_reference() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": LONG}}
    short = shortened_call(call, "m7")
    arguments = short["function"]["arguments"]
    parsed = json.loads(arguments)
    assert parsed["path"] == "src/app.py" and "ref=m7" in parsed["content"]
    assert len(arguments) < len(LONG) and short["id"] == "c1"
    assert shortened_call(call, "m7") == short  # deterministic
    small = {"id": "c2", "type": "function", "function": {"name": "w", "arguments": SHORT}}
    assert shortened_call(small, "m8") == small


# --- merging recorded steps ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "stage", "reclaimed", "arguments"),
    [
        ([(AGED, 900)], AGED, 900, 0),
        ([(AGED, 900), (CLEARED, 1_500)], CLEARED, 1_500, 0),
        ([(CLEARED, 1_500), (AGED, 900)], CLEARED, 1_500, 0),  # a late aged row changes nothing
        ([(AGED, 900), (AGED, 950)], AGED, 900, 0),  # one row per stage: the first stands
        ([(ARGUMENTS, 300)], ARGUMENTS, 300, 300),
        ([(ARGUMENTS, 300), (CLEARED, 100)], CLEARED, 400, 300),  # thinking dropped beside
        ([(CLEARED, 100), (ARGUMENTS, 300)], CLEARED, 400, 300),
        ([(ARGUMENTS, 300), (ARGUMENTS, 200)], ARGUMENTS, 300, 300),
    ],
)
def test_merge_step(
    rows: list[tuple[str, int]], stage: str, reclaimed: int, arguments: int
) -> None:
    """The recorded rows of one message, in any order, give one state; never backwards."""
    merged: ClearingRec | None = None
    for row_stage, saving in rows:
        merged = merge_step(merged, 5, PRESSURE, saving, row_stage, CAP)
    assert merged is not None
    assert (merged.stage, merged.tokens_reclaimed, merged.arguments_tokens) == (
        stage,
        reclaimed,
        arguments,
    )
    assert merged.kept_chars == (CAP if stage == AGED else None)


def test_steps_of_grows_with_every_step() -> None:
    """The profile key's step count: an aged result cleared, or arguments shortened, add one."""
    aged = merge_step(None, 1, PRESSURE, 900, AGED, CAP)
    cleared = merge_step(aged, 1, IDLE, 1_500)
    with_arguments = merge_step(cleared, 1, PRESSURE, 30, ARGUMENTS)
    assert steps_of([aged]) < steps_of([cleared]) < steps_of([with_arguments])
    assert steps_of([cleared]) == 2  # a state of clearings alone counts two a message


def test_describe_counts_each_stage() -> None:
    assert describe_steps(3, 0, 0, 900) == "cleared 3 old tool results (900 tokens)"
    assert describe_steps(1, 2, 3, 10) == (
        "cleared 1 and aged 2 old tool results, shortened the arguments of 3 old tool calls "
        "(10 tokens)"
    )
    plan = ClearingPlan(
        PRESSURE,
        (
            PlannedClearing(message_id=1, tokens_reclaimed=50, stage=AGED),
            PlannedClearing(message_id=2, tokens_reclaimed=70, gain=20),
        ),
    )
    assert plan.describe() == "cleared 1 and aged 1 old tool results (70 tokens)"


# --- the decision ------------------------------------------------------------------------------


def snapshot(branch: list[Msg], window: int, clearings: dict[int, ClearingRec]) -> policy.Snapshot:
    return policy.Snapshot(
        conversation_id="c",
        model=MODEL,
        window_override=window,
        branch=branch,
        summary=None,
        clearings=clearings,
        profile=None,
        now=NOW,
    )


def window_for(branch: list[Msg], history: int, knobs: policy.Knobs) -> int:
    """The smallest window whose trigger is at least ``history`` tokens."""
    window = 1_000
    while policy.pressure(snapshot(branch, window, {}), knobs).trigger < history:
        window += 50
    return window


KNOBS = policy.Knobs(keep_tool_results=2, clear_at_least_tokens=500, keep_tool_arguments=2)


def test_pressure_ages_when_that_is_enough_and_clears_when_not() -> None:
    """Cheapest loss first: ageing alone under the trigger -> aged; otherwise cleared (the
    aged ones on to cleared, the full ones straight there)."""
    branch = agent([BIG] * 6, arguments=LONG)
    history = policy.history_estimate(snapshot(branch, 100_000, {}))
    common: dict[str, Any] = {"keep_last": 2, "protected": (), "min_tokens": 1}
    ageing = plan_clearings(
        branch, {}, **common, reason=PRESSURE, stage=AGED, aged_chars=CAP, keep_arguments=2
    )
    roomy = window_for(branch, history - ageing.tokens_reclaimed, KNOBS)
    decision = policy.decide(snapshot(branch, roomy, {}), KNOBS)
    assert decision.action == policy.CLEAR and decision.clear is not None
    assert decision.clear.count(AGED) == 4 and decision.clear.count(ARGUMENTS) == 4
    assert decision.clear.count(CLEARED) == 0
    assert decision.reason.startswith("aged 4 old tool results, shortened the arguments of 4")
    aged = decision.clearings
    tight = window_for(branch, history - ageing.tokens_reclaimed - 300, KNOBS) - 400
    again = policy.decide(snapshot(branch, tight, aged), KNOBS)
    assert again.clear is not None and again.clear.count(CLEARED) == 4
    assert again.clear.count(AGED) == 0 and again.clear.count(ARGUMENTS) == 0
    gains = {item.message_id: item.saves for item in again.clear}
    for result in results_of(branch)[:4]:
        assert gains[result.id] == reclaimable(result) - aged[result.id].tokens_reclaimed
    straight = policy.decide(snapshot(branch, tight, {}), KNOBS)
    assert straight.clear is not None and straight.clear.count(CLEARED) == 4  # full -> cleared


def test_without_the_aged_stage_the_decision_only_clears() -> None:
    """``aged_result_chars`` 0: results go straight to cleared, arguments stay whole."""
    branch = agent([BIG] * 6, arguments=LONG)
    knobs = policy.Knobs(keep_tool_results=2, clear_at_least_tokens=500, aged_result_chars=0)
    history = policy.history_estimate(snapshot(branch, 100_000, {}))
    decision = policy.decide(snapshot(branch, window_for(branch, history - 100, knobs), {}), knobs)
    assert decision.clear is not None
    assert {item.stage for item in decision.clear} == {CLEARED} and len(decision.clear) == 4
    assert not policy.post_summary_clearing(branch, {}, knobs).count(AGED)


def test_after_a_summary_results_age_and_idle_clears_them() -> None:
    """The cold-cache moments: a new summary ages the old results (and arguments); the idle
    sweep's plan clears every result but the last ``idle_keep_tool_results``, aged ones too."""
    branch = agent([BIG] * 5, arguments=LONG)
    after_summary = policy.post_summary_clearing(branch, {}, KNOBS)
    assert after_summary.reason == POST_SUMMARY
    assert after_summary.count(AGED) == 3 and after_summary.count(ARGUMENTS) == 3
    aged = policy.with_plan({}, after_summary)
    idle = policy.idle_clearing(branch, aged, KNOBS)
    assert idle.reason == IDLE and {item.stage for item in idle} == {CLEARED}
    assert idle.message_ids == [m.id for m in results_of(branch)[:4]]  # idle keeps one
    done = policy.with_plan(aged, idle)
    assert not policy.idle_clearing(branch, done, KNOBS)
    assert not policy.post_summary_clearing(branch, done, KNOBS), "nothing goes back to aged"


# --- rendering ---------------------------------------------------------------------------------


def _message_frame(message: Msg) -> int:
    return tokens.count_message({**message.to_openai(), "content": ""}, ENCODING)


@pytest.mark.parametrize("seed", range(40))
def test_an_aged_text_keeps_within_its_cap_and_its_recorded_size(seed: int) -> None:
    """Any output (long lines, no newline, emoji, CJK) renders within the character cap and
    within the size its clearing recorded, names how much is left out, its reference and the
    saved file; the same input gives the same bytes."""
    rng = random.Random(seed)
    cap = rng.choice((500, 1_000, 4_000, 9_000))
    if rng.random() < 0.3:
        text = "".join(rng.choice(WORDS) for _ in range(rng.randint(300, 6_000)))  # no newline
    else:
        text = output(rng, rng.randint(50, 2_000), "line")
    path = rng.choice([None, "outputs/ab/abcdef.txt", "x" * 600])
    built = Builder()
    message = built.add({"role": "tool", "tool_call_id": "call_1", "name": "grep", "content": text})
    message = message._replace(output_path=path)
    saved = aged_reclaimable(message, cap)
    if saved <= 0:
        return
    keep = message.tokens - saved
    exists = rng.random() < 0.7
    frame = _message_frame(message)
    common = {"keep": keep, "max_chars": cap, "frame": frame, "encoding": ENCODING}
    sent = shorten.aged_text(text, **common, ref="m1", path=path, file_exists=exists)
    assert len(sent) <= cap
    assert frame + tokens.count_text(sent, ENCODING) <= keep
    assert AGED_MARK in sent and "ref=m1" in sent
    if path is not None and len(path) < 100:
        assert path in sent and (("has expired" in sent) is not exists)
    assert sent == shorten.aged_text(text, **common, ref="m1", path=path, file_exists=exists)


def test_the_aged_note_names_the_saved_file() -> None:
    assert "saved at outputs/a.txt" in aged_note(left=10, ref="m3", output_path="outputs/a.txt")
    assert "has expired" in aged_note(
        left=10, ref="m3", output_path="outputs/a.txt", file_exists=False
    )
    assert "Run the tool again" in aged_note(left=10, ref="m3")


def test_the_timeline_shows_aged_results_and_arguments() -> None:
    """``aged`` for a result sent as its head and tail and for a call with shortened
    arguments; ``cleared`` once the result is cleared."""
    branch = agent([BIG, BIG, BIG], arguments=LONG)
    plan = policy.post_summary_clearing(branch, {}, KNOBS)
    aged = policy.with_plan({}, plan)
    request = assemble(branch, model=MODEL, window=100_000, safety_margin=0, clearings=aged)
    states = {m.id: m.state for m in derive(branch, request, clearings=aged).messages}
    first_call, first_result = branch[1], branch[2]
    assert states[first_call.id] == AGED_STATE and states[first_result.id] == AGED_STATE
    assert states[branch[-1].id] == FULL
    cleared = policy.with_plan(aged, policy.idle_clearing(branch, aged, KNOBS))
    request = assemble(branch, model=MODEL, window=100_000, safety_margin=0, clearings=cleared)
    states = {m.id: m.state for m in derive(branch, request, clearings=cleared).messages}
    assert states[first_result.id] == CLEARED_STATE and states[first_call.id] == AGED_STATE


# --- seeded random lifecycles ------------------------------------------------------------------

RANK = {None: 0, AGED: 1, ARGUMENTS: 0, CLEARED: 2}
SEEDS = range(48)


def random_branch(rng: random.Random) -> list[Msg]:
    """User turns and agent steps: outputs from a line to thousands, parallel calls, long and
    short arguments, a protected tool now and then, saved files."""
    built = Builder()
    built.add({"role": "user", "content": "start"})
    for step in range(rng.randint(4, 22)):
        if rng.random() < 0.15:
            built.add({"role": "user", "content": f"and then {step}"})
        lines = rng.choice((1, 5, 40, 200, 700))
        arguments = rng.choice((SHORT, LONG, "{}"))
        tool = rng.choice(("bash", "grep", "read_file", "todo_write"))
        path = f"outputs/{step}.txt" if rng.random() < 0.3 else None
        built.step(
            output(rng, lines, f"s{step}"),
            tool=tool,
            arguments=arguments,
            path=path,
            calls=rng.choice((1, 1, 1, 2, 3)),
        )
    return built.branch


def _check_monotone(before: dict[int, ClearingRec], after: dict[int, ClearingRec]) -> None:
    for mid, old in before.items():
        new = after[mid]
        assert RANK[new.stage] >= RANK[old.stage], f"message {mid} went back"
        assert new.arguments_tokens >= old.arguments_tokens
        assert new.tokens_reclaimed >= old.tokens_reclaimed


def _check_request(branch: list[Msg], clearings: dict[int, ClearingRec], window: int) -> int:
    """Assemble; every aged result within its cap and every recorded message within its
    recorded size; the reported total the recount plus those sizes' unused tokens. Results the
    request sent shortened are recorded into ``clearings``, as the service does. Returns how
    many aged results were sent."""
    try:
        request = assemble(
            branch, model=MODEL, window=window, safety_margin=0.05, clearings=clearings
        )
    except BudgetError:
        return 0
    check_request(request)
    again = assemble(branch, model=MODEL, window=window, safety_margin=0.05, clearings=clearings)
    assert json.dumps(again.messages) == json.dumps(request.messages), (
        "the same state, the same bytes"
    )
    cut = dict(request.shortened)  # this request's own shortenings (a stored one stands after)
    for mid, reclaimed in request.shortened:
        clearings[mid] = merge_step(clearings.get(mid), mid, shorten.SHORTENED, reclaimed)
    by_call = {m.tool_call_id: m for m in branch if m.role == "tool"}
    by_calls = {m.tool_call_ids: m for m in branch if m.tool_calls}
    slack = 0
    aged = 0
    for sent in request.messages:
        if sent["role"] == "tool":
            stored = by_call.get(sent["tool_call_id"])
        elif sent.get("tool_calls"):
            stored = by_calls.get(tuple(call["id"] for call in sent["tool_calls"]))
        else:
            continue
        state = clearings.get(stored.id) if stored is not None else None
        if stored is None or state is None:
            continue
        size = stored.tokens - (
            state.arguments_tokens
            if stored.role == "assistant"
            else cut.get(stored.id, state.tokens_reclaimed)
        )
        actual = tokens.count_message(sent, ENCODING)
        assert actual <= size, f"message {stored.id} sent larger than its recorded size"
        slack += size - actual
        if state.aged:
            aged += 1
            assert state.kept_chars is not None and len(sent["content"]) <= state.kept_chars
            assert AGED_MARK in sent["content"] or sent["content"] == stored.content
    assert request.tokens.total == tokens.count_messages(request.messages, ENCODING) + slack
    return aged


@pytest.mark.parametrize("block", range(6))
def test_random_lifecycles_never_go_back_and_keep_their_caps(block: int) -> None:
    """Each seed grows a branch request by request and takes the decision's steps at random
    moments (pressure in a window the branch outgrows, a new summary, an idle gap) with random
    knobs: no step goes backwards, no request sends an aged result over its cap or any recorded
    message over its recorded size, and the count stays exact."""
    sent_aged = 0
    for seed in SEEDS[block * 8 : (block + 1) * 8]:
        rng = random.Random(seed)
        whole = random_branch(rng)
        knobs = policy.Knobs(
            keep_tool_results=rng.randint(0, 4),
            idle_keep_tool_results=rng.randint(0, 2),
            clear_at_least_tokens=rng.choice((0, 500, 2_000)),
            aged_result_chars=rng.choice((0, 500, 1_000, 4_000)),
            keep_tool_arguments=rng.randint(0, 5),
            protected_tools=("todo_write",),
        )
        window = rng.choice((8_000, 16_000, 40_000))
        clearings: dict[int, ClearingRec] = {}
        for end in sorted(rng.sample(range(2, len(whole) + 1), min(8, len(whole) - 1))):
            branch = whole[:end]
            moment = rng.choice(("pressure", "pressure", "post_summary", "idle"))
            if moment == "pressure":
                plan = policy.decide(snapshot(branch, window, clearings), knobs).clear
            elif moment == "post_summary":
                plan = policy.post_summary_clearing(branch, clearings, knobs)
            else:
                plan = policy.idle_clearing(branch, clearings, knobs)
            after = policy.with_plan(clearings, plan) if plan else dict(clearings)
            _check_monotone(clearings, after)
            if plan:
                assert all(item.saves > 0 for item in plan)
                assert all(item.stage != AGED or knobs.aged_result_chars for item in plan)
            clearings = after
            sent_aged += _check_request(branch, clearings, rng.choice((window, 100_000)))
    assert sent_aged > 0, "the block exercised aged results"
