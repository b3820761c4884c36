"""Request tokens per model call of a branch (pure), for the conversation page's chart.

Before each assistant message (a model call) the request held either the whole history before it
(without Recap) or what Recap sent then: the stored system prompt and the summary recorded by
that time, the messages after its cutoff, and the results cleared by that time at their
placeholder size. Both get the fixed parts the host last sent, and are scaled by the current
calibration factor into provider tokens, as ``recap stats`` counts and as the provider's
readings (plotted beside them) are. Clearings are summed with a Fenwick tree as the calls are
taken in time order, so a branch of 5,000 messages and thousands of clearings costs milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from recap.core.values.records import ClearingRec, Msg, SummaryRec

POINTS_MAX = 400  # model calls one chart plots; a longer branch is sampled evenly


@dataclass(frozen=True, kw_only=True)
class History:
    """What the chart is drawn from: the branch and when each of its records was written."""

    branch: Sequence[Msg]
    created: Mapping[int, datetime]  # message id -> when it was stored
    summaries: Sequence[SummaryRec]
    clearings: Mapping[int, ClearingRec]
    cleared_at: Mapping[int, datetime]  # message id -> when its clearing was recorded
    has_root_prompt: bool  # the branch starts with a stored system prompt (sent under a summary)


class _Sums:
    """A Fenwick tree: point additions and prefix sums over branch positions."""

    def __init__(self, size: int) -> None:
        self._tree = [0] * (size + 1)

    def add(self, position: int, value: int) -> None:
        index = position + 1
        while index < len(self._tree):
            self._tree[index] += value
            index += index & -index

    def before(self, position: int) -> int:
        """The sum over positions ``< position``."""
        total, index = 0, position
        while index > 0:
            total += self._tree[index]
            index -= index & -index
        return total


def sampled_calls(branch: Sequence[Msg], most: int = POINTS_MAX) -> list[int]:
    """Positions of the branch's assistant messages, at most ``most`` of them, evenly spread."""
    calls = [i for i, m in enumerate(branch) if m.role == "assistant"]
    if len(calls) <= most:
        return calls
    step = len(calls) / most
    return [calls[int(k * step)] for k in range(most)]


def sent_then(history: History, calls: Sequence[int]) -> dict[int, int]:
    """Stored tokens of the history Recap sent before each call position (see the module
    docstring), by position."""
    branch = history.branch
    positions = {m.id: i for i, m in enumerate(branch)}
    prefix = [0]
    for message in branch:
        prefix.append(prefix[-1] + message.tokens)
    on_branch = [
        (positions[s.cutoff_message_id], s.created_at, s.tokens)
        for s in history.summaries
        if s.cutoff_message_id in positions and s.created_at is not None
    ]
    pending = sorted(
        (history.cleared_at[mid], positions[mid], clearing.tokens_reclaimed)
        for mid, clearing in history.clearings.items()
        if mid in positions and mid in history.cleared_at
    )
    sums = _Sums(len(branch))
    taken = 0
    out: dict[int, int] = {}
    for at, index in sorted((history.created.get(branch[i].id), i) for i in calls if branch):
        if at is None:
            out[index] = prefix[index]
            continue
        while taken < len(pending) and pending[taken][0] <= at:
            sums.add(pending[taken][1], pending[taken][2])
            taken += 1
        start, head = 0, 0
        best = max(
            ((cut, tokens) for cut, written, tokens in on_branch if cut < index and written <= at),
            default=None,
        )
        if best is not None:
            start = best[0] + 1
            head = best[1] + (branch[0].tokens if history.has_root_prompt else 0)
        reclaimed = sums.before(index) - sums.before(start)
        out[index] = max(head + prefix[index] - prefix[start] - reclaimed, 0)
    return out


def request_series(
    history: History,
    *,
    fixed: int,
    calibration: float,
    readings: Sequence[tuple[int | None, int]],
    next_request: int,
    window: int,
) -> dict[str, Any]:
    """The chart's data: x positions (1-based message numbers), the two series, the provider's
    readings (``(leaf id, prompt tokens)``) placed at the message after their leaf, the next
    request and the window."""
    branch = history.branch
    calls = sampled_calls(branch)
    sent = sent_then(history, calls)
    positions = {m.id: i for i, m in enumerate(branch)}
    running, whole = 0, {}
    for index, message in enumerate(branch):
        whole[index] = running
        running += message.tokens
    return {
        "x": [i + 1 for i in calls],
        "without": [math.ceil((fixed + whole[i]) * calibration) for i in calls],
        "with": [math.ceil((fixed + sent[i]) * calibration) for i in calls],
        "measured": [
            {"x": positions[leaf] + 2, "y": tokens}
            for leaf, tokens in readings
            if leaf in positions
        ],
        "now": {"x": len(branch) + 1, "y": next_request},
        "window": window,
    }
