"""The compression decision (pure): skip, rest, clear or summarize, from a content-free snapshot.

This is the one place Recap decides what to do with a conversation. The compress worker, the
synchronous ``Recap.compress``, reconcile, ``stats``' suggestion and the cache benchmark
(``core.decision.cachecost.recap_policy``) call ``decide``; the idle sweep's set-based SQL takes its
thresholds from the same ``Knobs``, and the clearing after a new summary is
``post_summary_clearing``.

The snapshot holds ids, parents, stored token counts, roles and tool-call ids and names, the
clearings, the applicable summary's size, the request profile (``core.storage.profile``), the
failure history and the clock: no message text. Content is read afterwards, for the messages sent to
the summarizer only.

The decision, in order:

1. ``pressure``: the history's provider tokens (the calibrated estimate) against the trigger,
   ``trigger_ratio x available`` where ``available`` comes from ``core.counting.budget``. Under it:
   skip.
2. Urgent when the history takes ``urgent_ratio`` (0.95) of ``available`` or more: the next
   request is about to lose history, so the clear-at-least gate and the cooldown's wait go.
3. Take old tool results a step when that reclaims ``clear_at_least_tokens`` (any saving when
   urgent), cheapest loss first (``pressure_clearing``): aged (their head and tail; old calls'
   arguments shortened) when that alone brings the history under the trigger, else cleared; when
   the step brings the history under the trigger, that is all. Except that a clearing after an
   earlier pressure clearing is weighed against a summary by the provider's prompt cache each
   rewrites (``_cheaper_rewrite``): results taken a step at a time move the request's first
   changed message back and forth, and each step rewrites the cached prefix from there for a few
   turns' room, where a summary rewrites only what it keeps for far more room.
4. Otherwise summarize: the split of ``core.summaries.planning.plan_split`` (at a user message,
   or inside an agent turn at a step boundary, never between a call and its result). A span under
   ``min_summary_span_tokens`` is not sent: no summary of it would be smaller; unless the
   history is over the room (pressure over 1), where the next request would leave the span out
   with no summary covering it (a silent truncation), so it is summarized. After repeated
   failures the summarizer rests (``cooldown_until``); a "does not reduce" rejection is not a
   failure of the summarizer and does not count.

Pinned messages (``Snapshot.pinned``) are sent whatever is summarized or cleared: they are never
clearing candidates, the history counts those a summary covers (they are sent after it), and a
split's span is what it summarizes less its pinned messages, which stay in the request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from recap.core.counting import budget as budgets
from recap.core.counting import tokens
from recap.core.decision.toolresults import (
    IDLE,
    POST_SUMMARY,
    PRESSURE,
    min_tokens_for,
    plan_clearings,
)
from recap.core.request.branch import effective_history_tokens
from recap.core.summaries.planning import (
    REJECTED_NOT_SMALLER,
    Split,
    cooldown_until,
    message_tokens,
    pending_messages,
    plan_split,
    replaced_tokens,
    split_root,
)
from recap.core.values.clearing import ClearingPlan
from recap.core.values.profile import Profile
from recap.core.values.records import AGED, CLEARED, ClearingRec, Msg, SummaryRec, merge_step

SKIP = "skip"
REST = "rest"
CLEAR = "clear"
SUMMARIZE = "summarize"
RECENT_SHARE_OF_TRIGGER_MAX = 0.5  # the recent part never takes more than half the trigger
REASON_QUOTE_CHARS = 200  # a cooldown's reason quotes the last failure up to this length


@dataclass(frozen=True, slots=True, kw_only=True)
class Knobs:
    """The settings the decision reads (see the README's configuration table)."""

    safety_margin: float = 0.05
    trigger_ratio: float = 0.75
    recent_ratio: float = 0.2
    recent_min_tokens: int = 2_000
    recent_max_tokens: int = 8_000
    keep_turns: int = 2
    keep_tool_results: int = 3
    idle_keep_tool_results: int = 1
    protected_tools: tuple[str, ...] = ()
    clear_at_least_tokens: int = 2_000
    failure_streak: int = 3
    failure_cooldown_minutes: float = 10
    urgent_ratio: float = 0.95
    min_summary_span_tokens: int = 500
    default_fixed_tokens: int = 0
    reserve_output_tokens: int = 4_096
    idle_minutes: float = 60
    aged_result_chars: int = 4_000  # 0: no aged stage (results go full -> cleared)
    keep_tool_arguments: int = 10
    summary_max_output_tokens: int = 2_000  # a summary's expected size (``_cheaper_rewrite``)
    weigh_clearing: bool = True  # a clearing again is weighed against a summary

    @classmethod
    def from_settings(cls, settings: Any) -> Knobs:
        """The knobs of a ``core.settings.Settings``."""
        names = cls.__dataclass_fields__
        return cls(**{name: getattr(settings, name) for name in names})


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed run, as the cooldown sees it."""

    at: datetime
    reason: str

    @property
    def counts(self) -> bool:
        """A summary rejected for not being smaller is the planner's miss, not the
        summarizer's failure: it does not count towards the streak."""
        return REJECTED_NOT_SMALLER not in self.reason


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What the decision may look at: no message text."""

    conversation_id: str
    model: str
    window_override: int | None
    branch: Sequence[Msg]  # root first; ``content`` is not read
    summary: SummaryRec | None  # the applicable one (its text is not read here)
    clearings: Mapping[int, ClearingRec]
    profile: Profile | None
    now: datetime
    failures: tuple[Failure, ...] = ()  # failed runs since the last summary, newest first
    # The branch's pinned messages, root first, without text (those a summary covers too):
    # sent whatever is summarized or cleared, so fixed history (``core.request.pins``).
    pinned: tuple[Msg, ...] = ()
    # The branch's expanded attachments: their open and close marker ids (a summary's cut never
    # falls inside one).
    attached: tuple[tuple[int, int], ...] = ()
    # The other conversations it attaches, stored when the snapshot was read, with their
    # incarnations: a summary written after one of them is erased would quote it.
    sources: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def leaf_id(self) -> int | None:
        return self.branch[-1].id if self.branch else None

    @property
    def pinned_ids(self) -> frozenset[int]:
        return frozenset(m.id for m in self.pinned)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pressure:
    """The numbers of one decision, in provider tokens unless named otherwise."""

    budget: budgets.Budget
    history_estimate: int  # stored counts: summary and messages after its cutoff
    history: int  # the same, calibrated
    available: int
    trigger: int

    @property
    def ratio(self) -> float:
        return self.history / self.available if self.available > 0 else math.inf

    @property
    def over_trigger(self) -> bool:
        return self.history > self.trigger


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What to do now; ``clear`` may come with ``summarize`` and ``rest`` (cleared first)."""

    action: str
    reason: str
    pressure: Pressure
    clear: ClearingPlan | None = None
    split: Split | None = None
    urgent: bool = False
    clearings: Mapping[int, ClearingRec] = field(default_factory=dict)  # with ``clear`` applied


# --- the budget of one snapshot ----------------------------------------------------------------


def budget_of(snapshot: Snapshot, knobs: Knobs) -> budgets.Budget:
    """``core.counting.budget.request_budget`` for this conversation: its window, the output
    reserve, the fixed parts the host last sent (else the default and the stored system prompt, plus
    the reply priming) and the calibration factor."""
    window = tokens.context_window(snapshot.model, snapshot.window_override)
    profile = snapshot.profile
    reserve = budgets.output_reserve(
        tokens.model_info(snapshot.model),
        window_given=snapshot.window_override is not None,
        setting=knobs.reserve_output_tokens,
        override=profile.reserve_override if profile is not None else None,
    )
    sent = profile.sent if profile is not None else None
    factor = budgets.calibration_factor(  # the last request's mix, as ``assemble`` plans it
        profile.reading if profile is not None else None,
        leaf_id=snapshot.leaf_id,
        now=snapshot.now,
        composition=sent.composition if sent is not None else None,
    )
    return budgets.request_budget(
        window,
        safety_margin=knobs.safety_margin,
        output_reserve=reserve,
        fixed=fixed_tokens(snapshot, knobs),
        calibration=factor,
    )


def fixed_tokens(snapshot: Snapshot, knobs: Knobs) -> int:
    """Estimated tokens a request carries beside the history: what the host last passed to
    ``assemble`` (the stored system prompt when it passed none), else the default plus the
    stored system prompt; and the reply priming."""
    profile = snapshot.profile
    if profile is not None and profile.parts is not None:
        fixed = profile.parts.total
    else:
        root, _ = split_root(snapshot.branch)
        fixed = knobs.default_fixed_tokens + (root.tokens if root is not None else 0)
    return fixed + tokens.TOKENS_REPLY_PRIMING


def history_estimate(snapshot: Snapshot) -> int:
    """Stored tokens of the history a request carries: the summary and the messages after its
    cutoff, cleared results at their placeholder size (the stored system prompt is a fixed part),
    and the pinned messages the summary covers (sent after it)."""
    root, rest = split_root(snapshot.branch)
    total = effective_history_tokens(rest, snapshot.summary, snapshot.clearings)
    if snapshot.pinned:
        sent = {m.id for m in pending_messages(snapshot.branch, snapshot.summary)}
        total += sum(
            m.tokens
            for m in snapshot.pinned
            if m.id not in sent and (root is None or m.id != root.id)
        )
    return total


def pressure(snapshot: Snapshot, knobs: Knobs, history: int | None = None) -> Pressure:
    """The snapshot's history against its budget; ``history`` (estimated) when already known,
    for example as an upper bound read without the branch."""
    plan = budget_of(snapshot, knobs)
    estimate = history_estimate(snapshot) if history is None else history
    available = plan.available
    return Pressure(
        budget=plan,
        history_estimate=estimate,
        history=plan.history(estimate),
        available=available,
        trigger=int(knobs.trigger_ratio * max(available, 0)),
    )


def recent_budget(p: Pressure, knobs: Knobs) -> tuple[int, int]:
    """The recent part a summary leaves in full, and its cap, in estimated tokens: a share of
    the available room clamped to the settings, never more than half the trigger."""
    factor = p.budget.calibration
    available = max(int(p.available / factor), 0)
    trigger = int(p.trigger / factor)
    cap = min(knobs.recent_max_tokens, int(trigger * RECENT_SHARE_OF_TRIGGER_MAX))
    wanted = max(int(knobs.recent_ratio * available), knobs.recent_min_tokens)
    return max(min(wanted, knobs.recent_max_tokens, cap), 0), max(cap, 0)


# --- the decision ------------------------------------------------------------------------------


def decide(snapshot: Snapshot, knobs: Knobs, *, force: bool = False) -> Decision:
    """Skip, rest, clear or summarize (see the module docstring). ``force`` summarizes whatever
    the pressure, with no clearing first and no cooldown."""
    p = pressure(snapshot, knobs)
    if not force and not p.over_trigger:
        return Decision(
            action=SKIP, reason=f"under the trigger ({p.history} of {p.trigger} tokens)", pressure=p
        )
    urgent = p.ratio >= knobs.urgent_ratio
    pending = pending_messages(snapshot.branch, snapshot.summary)
    clearings: Mapping[int, ClearingRec] = snapshot.clearings
    plan: ClearingPlan | None = None
    if not force:
        gate = 1 if urgent else min_tokens_for(PRESSURE, knobs.clear_at_least_tokens)
        plan = pressure_clearing(pending, clearings, knobs, p, gate, snapshot.pinned_ids)
        if plan:
            saved = plan.tokens_reclaimed
            reason = plan.describe()
            clearings = with_plan(clearings, plan)
            if p.history - p.budget.history(saved) <= p.trigger:
                cleared = Decision(
                    action=CLEAR,
                    reason=reason,
                    pressure=p,
                    clear=plan,
                    urgent=urgent,
                    clearings=clearings,
                )
                return _cheaper_rewrite(snapshot, knobs, p, cleared, pending)
        else:
            plan = None
    return _summarize(snapshot, knobs, p, plan, clearings, urgent=urgent, force=force)


def _cheaper_rewrite(
    snapshot: Snapshot, knobs: Knobs, p: Pressure, cleared: Decision, pending: Sequence[Msg]
) -> Decision:
    """A pressure clearing after an earlier one, or a summary when that rewrites the provider's
    cached prefix less for the room it makes (the module's step 3): the clearing rewrites the
    request from its first changed message on, for the tokens it reclaims; the summary rewrites
    what it keeps (the recent part, and the summary expected at its cap and weighed as generated
    too: ``SUMMARY_WRITE_WEIGHT``), for the history less that. The first clearing under pressure
    always stands (cheapest loss first), and so does one that only takes results already taken
    a step further (aged on to cleared)."""
    plan, old = cleared.clear, snapshot.clearings
    if (
        plan is None
        or not knobs.weigh_clearing
        or not any(rec.reason == PRESSURE for rec in old.values())
    ):
        return cleared
    changed = {item.message_id for item in plan}
    if changed <= old.keys():
        return cleared  # a step further on results already taken (aged on to cleared)
    first = next((i for i, m in enumerate(pending) if m.id in changed), None)
    if first is None:
        return cleared
    rewrite = sum(message_tokens(m, old) for m in pending[first:])
    alt = _summarize(snapshot, knobs, p, None, old, urgent=cleared.urgent, force=False)
    if alt.action != SUMMARIZE or alt.split is None:
        return cleared
    recent = sum(message_tokens(m, old) for m in alt.split.recent)
    cap = knobs.summary_max_output_tokens
    summary = min(alt.split.summary_room or cap, cap)
    made = p.history_estimate - recent - summary
    cost = recent + summary * SUMMARY_WRITE_WEIGHT  # the summary is generated, then written
    if made <= 0 or rewrite * made <= cost * max(plan.tokens_reclaimed, 1):
        return cleared
    return dataclasses.replace(
        alt, reason=REWRITE_REASON.format(rewrite=rewrite, room=plan.tokens_reclaimed)
    )


# A summary's tokens weigh five times a rewritten token: generated once (output is priced at
# about four times input: Anthropic 5x, OpenAI 4x), then written to the cache.
SUMMARY_WRITE_WEIGHT = 5
REWRITE_REASON = (
    "a clearing again would rewrite {rewrite} cached tokens for {room} tokens of room: "
    "summarized instead"
)


def _summarize(
    snapshot: Snapshot,
    knobs: Knobs,
    p: Pressure,
    plan: ClearingPlan | None,
    clearings: Mapping[int, ClearingRec],
    *,
    urgent: bool,
    force: bool,
) -> Decision:
    pending = pending_messages(snapshot.branch, snapshot.summary)
    pins = snapshot.pinned_ids
    budget, cap = recent_budget(p, knobs)
    split = plan_split(
        pending,
        recent_budget=budget,
        recent_cap=cap,
        keep_turns=knobs.keep_turns,
        clearings=clearings,
        attached=snapshot.attached,
    )
    fallback = CLEAR if plan else SKIP
    span = replaced_tokens(split.older, clearings, pins) if split is not None else 0
    if p.ratio > 1 and span < knobs.min_summary_span_tokens:  # over the room: cut deeper
        deeper = plan_split(
            pending,
            recent_budget=budget // 2,
            recent_cap=cap,
            keep_turns=1,
            clearings=clearings,
            attached=snapshot.attached,
        )
        if deeper is not None:
            split = deeper
            span = replaced_tokens(split.older, clearings, pins)
    if split is None:
        reason = "nothing older than the recent turns to summarize"
        return Decision(
            action=fallback,
            reason=reason,
            pressure=p,
            clear=plan,
            urgent=urgent,
            clearings=clearings,
        )
    split = dataclasses.replace(split, summary_room=summary_room(p, split, clearings, pins))
    # over the room, the next request leaves the span out with nothing covering it: however
    # small, it is summarized (a summary that does not reduce is rejected by the run)
    if span < knobs.min_summary_span_tokens and not (p.ratio > 1 and span > 0):
        reason = (
            f"the {span} tokens before the recent turns are below the smallest span worth "
            f"summarizing ({knobs.min_summary_span_tokens})"
        )
        return Decision(
            action=fallback,
            reason=reason,
            pressure=p,
            clear=plan,
            urgent=urgent,
            clearings=clearings,
        )
    resting = None if force or urgent else cooldown_reason(snapshot, knobs)
    if resting is not None:
        return Decision(
            action=REST, reason=resting, pressure=p, clear=plan, urgent=urgent, clearings=clearings
        )
    return Decision(
        action=SUMMARIZE,
        reason="",
        pressure=p,
        clear=plan,
        split=split,
        urgent=urgent,
        clearings=clearings,
    )


SUMMARY_ROOM_FLOOR = 256  # the least a summary is asked to fit in: less keeps nothing useful


def summary_room(
    p: Pressure,
    split: Split,
    clearings: Mapping[int, ClearingRec],
    pinned: Collection[int] = frozenset(),
) -> int:
    """Estimated tokens the summary may take: half of what the trigger leaves beside the recent
    part it keeps (and the pinned messages it covers, which are sent after it), so that the
    summary, the recent turns and the next few turns fit the room (a summary planned without it
    can crowd the newest turn out of a small window)."""
    factor = p.budget.calibration
    recent = sum(message_tokens(m, clearings) for m in split.recent)
    recent += sum(m.tokens for m in split.older if m.id in pinned)
    return max((int(p.trigger / factor) - recent) // 2, SUMMARY_ROOM_FLOOR)


def cooldown_reason(snapshot: Snapshot, knobs: Knobs) -> str | None:
    """Why the summarizer rests now after repeated failures, or None when it may run."""
    failures = [f for f in snapshot.failures if f.counts]
    until = cooldown_until(
        [f.at for f in failures],
        streak=knobs.failure_streak,
        first_minutes=knobs.failure_cooldown_minutes,
    )
    if until is None or snapshot.now >= until:
        return None
    return (
        f"resting after {len(failures)} failed runs in a row (the last: "
        f"{failures[0].reason[:REASON_QUOTE_CHARS]}); the summarizer is tried again after "
        f"{until:%Y-%m-%d %H:%M} UTC, or now with force"
    )


def with_plan(clearings: Mapping[int, ClearingRec], plan: ClearingPlan) -> dict[int, ClearingRec]:
    """The clearings once ``plan`` is applied (each step merged as the stored rows are)."""
    applied = dict(clearings)
    for item in plan:
        applied[item.message_id] = merge_step(
            applied.get(item.message_id),
            item.message_id,
            plan.reason,
            item.tokens_reclaimed,
            item.stage,
            item.kept_chars,
        )
    return applied


def pressure_clearing(
    pending: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    knobs: Knobs,
    p: Pressure,
    gate: int,
    pinned: Collection[int] = frozenset(),
) -> ClearingPlan:
    """Over the trigger, cheapest loss first: age the old tool results (and shorten the old
    calls' arguments) when that alone brings the history under the trigger; otherwise clear
    them (full ones straight to cleared, aged ones on to cleared). Either plan must save
    ``gate`` tokens: a smaller change is not worth the warm cache it costs."""
    common: dict[str, Any] = {
        "keep_last": knobs.keep_tool_results,
        "protected": knobs.protected_tools,
        "min_tokens": gate,
        "reason": PRESSURE,
        "aged_chars": knobs.aged_result_chars,
        "keep_arguments": knobs.keep_tool_arguments,
        "pinned": pinned,
    }
    if knobs.aged_result_chars > 0:
        aged = plan_clearings(pending, clearings, stage=AGED, **common)
        if aged and p.history - p.budget.history(aged.tokens_reclaimed) <= p.trigger:
            return aged
    return plan_clearings(pending, clearings, stage=CLEARED, **common)


# --- the other clearing moments ----------------------------------------------------------------


def post_summary_clearing(
    recent: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    knobs: Knobs,
    pinned: Collection[int] = frozenset(),
) -> ClearingPlan:
    """After a new summary the request's prefix changed and its prompt cache is cold anyway:
    take the old results after the cutoff one step, any saving being worth it: aged (and the old
    calls' arguments shortened) with the aged stage on, else cleared. The summary does not cover
    the recent part it leaves, so its old results keep their head and tail rather than nothing;
    the summary has just made room, and pressure clears them later if it must."""
    aged = knobs.aged_result_chars > 0
    return plan_clearings(
        recent,
        clearings,
        keep_last=knobs.keep_tool_results,
        protected=knobs.protected_tools,
        min_tokens=min_tokens_for(POST_SUMMARY, 0),
        reason=POST_SUMMARY,
        pinned=pinned,
        stage=AGED if aged else CLEARED,
        aged_chars=knobs.aged_result_chars,
        keep_arguments=knobs.keep_tool_arguments if aged else None,
    )


def idle_clearing(
    sent: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    knobs: Knobs,
    pinned: Collection[int] = frozenset(),
) -> ClearingPlan:
    """Past ``idle_minutes`` the provider's cache has expired: clear all but the last
    ``idle_keep_tool_results`` (aged ones too: the cheapest moment for the largest step). The
    idle sweep does the same in set-based SQL (``core.storage.sweep``, with these knobs); it
    shortens no arguments (their savings need a tokenizer)."""
    return plan_clearings(
        sent,
        clearings,
        keep_last=knobs.idle_keep_tool_results,
        protected=knobs.protected_tools,
        min_tokens=min_tokens_for(IDLE, 0),
        reason=IDLE,
        pinned=pinned,
    )


def early_skip(head: Snapshot, knobs: Knobs, history_bound: int) -> Decision | None:
    """The skip ``decide`` would return, known from an upper bound on the history alone (the
    snapshot's branch not read yet: ``core.storage.snapshot.history_bound``), or None when the bound
    does not settle it. The stored system prompt is inside the bound, so leaving it out of the
    fixed parts here keeps the answer on the safe side."""
    p = pressure(head, knobs, history=history_bound)
    if p.over_trigger:
        return None
    return Decision(
        action=SKIP, reason=f"under the trigger ({p.history} of {p.trigger} tokens)", pressure=p
    )
