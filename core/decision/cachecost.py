"""The prompt-cache price of clearing tool results, replayed request by request (pure).

One request per assistant step: the request sent to produce assistant message ``i`` holds every
message before it, cleared tool results rendered as their placeholder. A request's cached part is
its longest prefix of whole messages identical, byte for byte, to the previous request of the same
run (nothing is cached across an idle gap: the provider's cache has expired). Its cost is uncached
tokens x 1.25 + cached tokens x 0.1 (prompt-cache write and read prices relative to plain input).

A policy is called before each request with what it may look at and returns the ids it clears
now, or the plan of steps it records (results aged or cleared, old arguments shortened: the aged
stage); steps are one-way, so they accumulate. ``recap_policy`` is the production decision
(``core.decision.policy``, the aged stage on or off as its knobs say); ``never`` and
``keep_last_every_request`` are the baselines.

``oracle`` is the limit: the cheapest clearing schedule for a run, found exactly by dynamic
programming over its steps by a policy that knows every future request and the idle gap, in the
same action space as production (before a request, clear the oldest results worth clearing,
never the last ``keep_last`` results, ``gap_keep_last`` at the first request after the gap).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from recap.core.counting import tokens
from recap.core.decision.policy import Knobs, Snapshot, decide, idle_clearing, with_plan
from recap.core.decision.toolresults import IDLE, plan_clearings, reclaimable, tool_names
from recap.core.request.assembly import render_stored
from recap.core.values.clearing import ClearingPlan
from recap.core.values.records import AGED, ARGUMENTS, CLEARED, ClearingRec, Msg

UNCACHED_PRICE = 1.25  # writing the prompt cache costs a quarter more than plain input
CACHED_PRICE = 0.1  # reading it costs a tenth
REPLAY_CLOCK = datetime(2026, 1, 1, tzinfo=UTC)  # the decision's clock: no failures to age


@dataclass(frozen=True, kw_only=True)
class Moment:
    """What a policy sees before one request."""

    step: int  # index of the request in the run
    branch: Sequence[Msg]  # the messages the request is built from
    clearings: Mapping[int, ClearingRec]
    after_gap: bool  # the first request after the idle gap
    history_tokens: int  # tokens of the request as it would be sent now


Policy = Callable[[Moment], "list[int] | ClearingPlan"]


@dataclass(kw_only=True)
class RunCost:
    """Totals of one replayed run under one policy."""

    cost: float = 0.0
    tokens: int = 0
    cached: int = 0
    tokens_after_gap: int = 0
    requests: int = 0
    cleared: int = 0
    aged: int = 0  # results left aged at the end of the run
    aged_steps: int = 0  # results aged along the run (some cleared later)
    argument_steps: int = 0  # assistant messages whose old arguments were shortened
    costs: list[float] = field(default_factory=list)


def never(_: Moment) -> list[int]:
    """The baseline that never clears."""
    return []


def keep_last_every_request(keep: int) -> Policy:
    """The common default elsewhere: before every request, clear all but the last ``keep``."""

    def policy(moment: Moment) -> list[int]:
        plan = plan_clearings(
            moment.branch, moment.clearings, keep_last=keep, protected=(), min_tokens=1, reason=IDLE
        )
        return plan.message_ids

    return policy


def recap_policy(knobs: Knobs, *, model: str, window: int | None = None) -> Policy:
    """Recap's production decision (``core.decision.policy``): after the idle gap, what the idle
    sweep clears (``idle_clearing``, the sweep's own knobs); otherwise whatever ``decide`` ages or
    clears under pressure (nothing while the request is under the trigger, so the cache stays
    warm). Summaries are not priced here: no summarizer runs in a replay of clearings."""

    def chosen(moment: Moment) -> ClearingPlan:
        if moment.after_gap:
            return idle_clearing(moment.branch, moment.clearings, knobs)
        snapshot = Snapshot(
            conversation_id="replay",
            model=model,
            window_override=window,
            branch=moment.branch,
            summary=None,
            clearings=moment.clearings,
            profile=None,
            now=REPLAY_CLOCK,
        )
        decision = decide(snapshot, knobs)
        return decision.clear or ClearingPlan(IDLE)

    return chosen


def to_msgs(messages: Sequence[Mapping[str, object]], encoding: str) -> list[Msg]:
    """An imported run as stored messages (ids from 1, counts from ``core.counting.tokens``)."""
    out: list[Msg] = []
    for index, message in enumerate(messages):
        content = message.get("content")
        calls = message.get("tool_calls") or ()
        out.append(
            Msg(
                id=index + 1,
                parent_id=index or None,
                role=str(message["role"]),
                content=content if isinstance(content, str) else None,
                tokens=tokens.count_message(message, encoding),
                tool_calls=tuple(calls) if isinstance(calls, list | tuple) else (),
                tool_call_id=message.get("tool_call_id"),  # type: ignore[arg-type]
                name=message.get("name"),  # type: ignore[arg-type]
            )
        )
    return out


class _Renderer:
    """Each message's bytes and tokens as sent in each of its states (full, aged, cleared, its
    arguments shortened: ``core.request.assembly.render_stored``), computed once per state."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._cache: dict[tuple[int, ClearingRec | None], tuple[str, int]] = {}

    def render(self, message: Msg, state: ClearingRec | None) -> tuple[str, int]:
        key = (message.id, state)
        if key not in self._cache:
            if state is None:
                body = message.to_openai()
                count = message.tokens
            else:
                body = render_stored(message, {message.id: state}, self.encoding)
                count = tokens.count_message(body, self.encoding)
            self._cache[key] = (json.dumps(body, sort_keys=True, ensure_ascii=False), count)
        return self._cache[key]


CLEARED_STATE = ClearingRec(message_id=0, reason=IDLE)  # a result as its placeholder (``_state``)


def _state(message: Msg, clearings: Mapping[int, ClearingRec]) -> ClearingRec | None:
    """The message's recorded state, as far as it changes how the message is sent."""
    found = clearings.get(message.id)
    if found is None or (message.role != "tool" and not found.arguments_tokens):
        return None
    return replace(found, message_id=0)


def replay(branch: Sequence[Msg], policy: Policy, *, encoding: str, gap_at: int | None) -> RunCost:
    """Price one run under one policy; ``gap_at`` is the request index the idle gap precedes."""
    steps = request_ends(branch)
    renderer = _Renderer(encoding)
    clearings: dict[int, ClearingRec] = {}
    previous: list[str] = []
    result = RunCost()
    for step, end in enumerate(steps):
        sent = branch[:end]
        after_gap = step == gap_at
        current = _rendered(sent, clearings, renderer)
        moment = Moment(
            step=step,
            branch=sent,
            clearings=dict(clearings),
            after_gap=after_gap,
            history_tokens=sum(c for _, c in current),
        )
        chosen = policy(moment)
        if isinstance(chosen, ClearingPlan):
            clearings = with_plan(clearings, chosen)
            result.aged_steps += chosen.count(AGED)
            result.argument_steps += chosen.count(ARGUMENTS)
        else:
            for message_id in chosen:
                clearings.setdefault(message_id, ClearingRec(message_id=message_id, reason=IDLE))
        current = _rendered(sent, clearings, renderer)
        texts = [text for text, _ in current]
        cost, cached, total = priced(
            previous, texts, [count for _, count in current], after_gap=after_gap
        )
        result.costs.append(cost)
        result.cost += cost
        result.tokens += total
        result.cached += cached
        result.requests += 1
        if gap_at is not None and step >= gap_at:
            result.tokens_after_gap += total
        previous = texts
    result.cleared = sum(1 for c in clearings.values() if c.stage == CLEARED)
    result.aged = sum(1 for c in clearings.values() if c.stage == AGED)
    return result


def _rendered(
    sent: Sequence[Msg], clearings: Mapping[int, ClearingRec], renderer: _Renderer
) -> list[tuple[str, int]]:
    return [renderer.render(m, _state(m, clearings)) for m in sent]


def priced(
    previous: Sequence[str], texts: Sequence[str], counts: Sequence[int], *, after_gap: bool
) -> tuple[float, int, int]:
    """One request's cost, cached tokens and total tokens: its longest prefix of whole messages
    identical to the previous request is cached (nothing is, right after an idle gap)."""
    shared = 0 if after_gap else common_prefix(previous, texts)
    cached = sum(counts[:shared])
    total = sum(counts)
    return (total - cached) * UNCACHED_PRICE + cached * CACHED_PRICE, cached, total


def common_prefix(before: Sequence[str], after: Sequence[str]) -> int:
    count = 0
    for old, new in zip(before, after, strict=False):
        if old != new:
            break
        count += 1
    return count


def middle_step(branch: Sequence[Msg]) -> int:
    """The request index at the middle of a run (where the benchmark puts its idle gap)."""
    steps = sum(1 for i, m in enumerate(branch) if m.role == "assistant" and i > 0)
    return steps // 2


# --- the limit: the best schedule, knowing the whole run ---------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunShape:
    """A run as plain numbers, one entry per message, for ``oracle``."""

    tokens: Sequence[int]  # each message's tokens as sent in full
    placeholder: Mapping[int, int]  # position -> tokens as a placeholder, results worth clearing
    results: Sequence[int]  # positions of every tool result, in order: what "the last k" counts
    ends: Sequence[int]  # request ``s`` sends the messages before position ``ends[s]``
    gap_at: int | None = None  # the request the idle gap precedes


@dataclass(frozen=True)
class Schedule:
    """The cheapest schedule: its cost, and how many of the oldest results worth clearing are
    cleared when each request is sent."""

    cost: float
    cleared: tuple[int, ...]


def oracle(shape: RunShape, *, keep_last: int, gap_keep_last: int) -> Schedule:
    """The least total cost of a run over every clearing schedule, by dynamic programming.

    Before request ``s`` a schedule may clear the oldest results worth clearing (``placeholder``
    keys, in position order) up to any count, never one of the last ``keep_last`` tool results
    (``gap_keep_last`` at the first request after the gap); clearings are one-way. The state after
    a request is how many are cleared, and a request's cost depends only on that count before and
    after it: its cached prefix ends at the first result newly cleared, or at the previous
    request's end, so the recurrence is exact.
    """
    clearable = sorted(shape.placeholder)
    full = [0]  # full[i]: tokens of the messages before position i
    for count in shape.tokens:
        full.append(full[-1] + count)
    saved = [0]  # saved[j]: tokens the first j results worth clearing reclaim
    for position in clearable:
        saved.append(saved[-1] + shape.tokens[position] - shape.placeholder[position])
    best: dict[int, float] = {0: 0.0}
    came_from: list[dict[int, int]] = []
    previous_end = 0
    for step, end in enumerate(shape.ends):
        keep = gap_keep_last if step == shape.gap_at else keep_last
        limit = _clearable_limit(shape.results, clearable, end, keep)
        cold = step == 0 or step == shape.gap_at
        following: dict[int, float] = {}
        origin: dict[int, int] = {}
        for before, so_far in sorted(best.items()):
            for after in range(before, max(before, limit) + 1):
                total = full[end] - saved[after]
                cached = 0
                if not cold:
                    stop = previous_end if after == before else min(clearable[before], previous_end)
                    cached = full[stop] - saved[before]
                cost = so_far + (total - cached) * UNCACHED_PRICE + cached * CACHED_PRICE
                if after not in following or cost < following[after]:
                    following[after], origin[after] = cost, before
        best, previous_end = following, end
        came_from.append(origin)
    state = min(best, key=lambda count: (best[count], count))
    cost, counts = best[state], [state]
    for origin in reversed(came_from[1:]):
        state = origin[state]
        counts.append(state)
    return Schedule(cost, tuple(reversed(counts)) if shape.ends else ())


def _clearable_limit(results: Sequence[int], clearable: Sequence[int], end: int, keep: int) -> int:
    """How many of the oldest results worth clearing lie before the last ``keep`` tool results of
    a request that sends the messages before ``end``."""
    sent = bisect_left(results, end)
    if sent <= keep:
        return 0
    boundary = results[sent - keep] if keep > 0 else end
    return bisect_left(clearable, boundary)


def shape_of(branch: Sequence[Msg], *, encoding: str, protected: Sequence[str] = ()) -> RunShape:
    """The run's numbers as ``replay`` prices them: every message's tokens in full and, for each
    result worth clearing (its placeholder smaller, its tool not protected: what
    ``core.decision.toolresults.plan_clearings`` may clear), as a placeholder."""
    renderer = _Renderer(encoding)
    names = tool_names(branch)
    shielded = {name.lower() for name in protected}
    placeholder: dict[int, int] = {}
    results: list[int] = []
    for position, message in enumerate(branch):
        if message.role != "tool":
            continue
        results.append(position)
        name = (message.name or names.get(message.tool_call_id or "") or "").lower()
        if reclaimable(message) > 0 and name not in shielded:
            placeholder[position] = renderer.render(message, CLEARED_STATE)[1]
    return RunShape(
        tokens=[renderer.render(m, None)[1] for m in branch],
        placeholder=placeholder,
        results=results,
        ends=request_ends(branch),
    )


def request_ends(branch: Sequence[Msg]) -> list[int]:
    """Where each request of a run ends: one request per assistant step (``replay``'s steps)."""
    return [i for i, m in enumerate(branch) if m.role == "assistant" and i > 0]


def following(branch: Sequence[Msg], shape: RunShape, schedule: Schedule) -> Policy:
    """A policy that clears what ``schedule`` says, for ``replay`` to price."""
    ids = [branch[position].id for position in sorted(shape.placeholder)]

    def policy(moment: Moment) -> list[int]:
        return ids[: schedule.cleared[moment.step]]

    return policy


def oracle_cost(
    branch: Sequence[Msg], knobs: Knobs, *, encoding: str, gap_at: int | None
) -> Schedule:
    """The limit for one run with production's floors: ``knobs.keep_tool_results`` kept in full,
    ``knobs.idle_keep_tool_results`` at the first request after the gap."""
    shape = replace(
        shape_of(branch, encoding=encoding, protected=knobs.protected_tools), gap_at=gap_at
    )
    return oracle(
        shape, keep_last=knobs.keep_tool_results, gap_keep_last=knobs.idle_keep_tool_results
    )
