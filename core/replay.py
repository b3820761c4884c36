"""Replaying a stored agent run request by request, to price clearing policies (pure).

One request per assistant step: the request sent to produce assistant message ``i`` holds every
message before it, cleared tool results rendered as their placeholder. A request's cached part is
its longest prefix of whole messages identical, byte for byte, to the previous request of the same
run (nothing is cached across an idle gap: the provider's cache has expired). Its cost is uncached
tokens x 1.25 + cached tokens x 0.1 (prompt-cache write and read prices relative to plain input).

A policy is called before each request with what it may look at and returns the ids it clears
now; clearings are one-way, so they accumulate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from core import tokens
from core.placeholders import cleared_placeholder
from core.policy import Knobs, Snapshot, decide, idle_clearing
from core.records import ClearingRec, Msg
from core.toolresults import IDLE, plan_clearings

UNCACHED_PRICE = 1.25  # writing the prompt cache costs a quarter more than plain input
CACHED_PRICE = 0.1  # reading it costs a tenth
REPLAY_CLOCK = datetime(2026, 1, 1, tzinfo=UTC)  # the decision's clock: no failures to age


@dataclass(frozen=True)
class Moment:
    """What a policy sees before one request."""

    step: int  # index of the request in the run
    branch: Sequence[Msg]  # the messages the request is built from
    clearings: Mapping[int, ClearingRec]
    after_gap: bool  # the first request after the idle gap
    history_tokens: int  # tokens of the request as it would be sent now


Policy = Callable[[Moment], list[int]]


@dataclass
class RunCost:
    """Totals of one replayed run under one policy."""

    cost: float = 0.0
    tokens: int = 0
    cached: int = 0
    tokens_after_gap: int = 0
    requests: int = 0
    cleared: int = 0
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
    """Recap's production decision (``core.policy``): after the idle gap, what the idle sweep
    clears (``idle_clearing``, the sweep's own knobs); otherwise whatever ``decide`` clears
    under pressure (nothing while the request is under the trigger, so the cache stays warm).
    Summaries are not priced here: no summarizer runs in a replay of clearings."""

    def chosen(moment: Moment) -> list[int]:
        if moment.after_gap:
            return idle_clearing(moment.branch, moment.clearings, knobs).message_ids
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
        return decision.clear.message_ids if decision.clear else []

    return chosen


def to_msgs(messages: Sequence[Mapping[str, object]], encoding: str) -> list[Msg]:
    """An imported run as stored messages (ids from 1, counts from ``core.tokens``)."""
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
    """Each message's bytes and tokens as sent, cleared or not (computed once per state)."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._cache: dict[tuple[int, bool], tuple[str, int]] = {}

    def render(self, message: Msg, cleared: bool) -> tuple[str, int]:
        key = (message.id, cleared)
        if key not in self._cache:
            body = message.to_openai()
            if cleared:
                body["content"] = cleared_placeholder(
                    tool_name=message.name,
                    call_id=message.tool_call_id or "",
                    tokens=message.tokens,
                    output_path=message.output_path,
                )
            text = json.dumps(body, sort_keys=True, ensure_ascii=False)
            count = message.tokens if not cleared else tokens.count_message(body, self.encoding)
            self._cache[key] = (text, count)
        return self._cache[key]


def replay(branch: Sequence[Msg], policy: Policy, *, encoding: str, gap_at: int | None) -> RunCost:
    """Price one run under one policy; ``gap_at`` is the request index the idle gap precedes."""
    steps = [i for i, m in enumerate(branch) if m.role == "assistant" and i > 0]
    renderer = _Renderer(encoding)
    clearings: dict[int, ClearingRec] = {}
    previous: list[str] = []
    result = RunCost()
    for step, end in enumerate(steps):
        sent = branch[:end]
        after_gap = step == gap_at
        current = _rendered(sent, clearings, renderer)
        moment = Moment(step, sent, dict(clearings), after_gap, sum(c for _, c in current))
        for message_id in policy(moment):
            clearings.setdefault(message_id, ClearingRec(message_id, IDLE))
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
    result.cleared = len(clearings)
    return result


def _rendered(
    sent: Sequence[Msg], clearings: Mapping[int, ClearingRec], renderer: _Renderer
) -> list[tuple[str, int]]:
    return [renderer.render(m, m.id in clearings and m.role == "tool") for m in sent]


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
