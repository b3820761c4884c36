"""Which summary a request uses when the newest one is ready but not in use yet.

A compression run writes its summary pending, with the clearings it makes free after it; the
request read (``core.storage.reads.request_branch``) asks here which to send. The choice is
``core.decision.activation.activate`` over counts the read already holds: the request without
the ready summary (the summary in use and the messages after its cutoff, with the clearings
recorded before the ready one), with it (its clearings included), the budget, the last step's
growth (the messages after the leaf the previous request was assembled for) and the idle time
since then. Waiting, the request is built as before: the summary in use and the clearings
recorded before the ready summary. Using it, the request records its first use
(``compressed.activate_summary``, with the request's other writes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from recap.core.decision import activation as rules
from recap.core.request.branch import applicable_summary
from recap.core.storage import compressed
from recap.core.values.profile import Profile
from recap.core.values.records import ClearingRec, SummaryRec

ClearingsBefore = Callable[[datetime], dict[int, ClearingRec]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What the choice knows beside the branch: the model's cache rules, the setting, the idle
    time since the last request was assembled and that request's leaf, and how to read the
    clearings without the batch a ready summary's run recorded after it (one query, made only
    while a summary waits)."""

    rules: rules.CacheRules
    horizon: int
    idle_seconds: float | None
    sent_leaf: int | None
    clearings_before: ClearingsBefore
    fixed: int = 0  # the fixed parts the host last sent, inside the request's budget


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """The summary and clearings a request is built from; ``activated`` the ready summary it
    uses for the first time (to record), ``waiting`` the one it leaves for later."""

    summary: SummaryRec | None
    clearings: dict[int, ClearingRec]
    activated: SummaryRec | None = None
    waiting: SummaryRec | None = None
    reason: str = ""


def sent_tokens(
    path: Sequence[int],
    stored: Sequence[int],
    summary: SummaryRec | None,
    clearings: dict[int, ClearingRec],
) -> int:
    """Estimated tokens of the history a request sends with ``summary``: the root, the summary
    and the messages after its cutoff, cleared ones at their placeholder size (the budget's
    units: stored counts, as ``reads.request_branch`` compares with it)."""
    start = 0
    total = 0
    if summary is not None and summary.cutoff_message_id in path:
        start = path.index(summary.cutoff_message_id) + 1
        total = summary.tokens + (stored[0] if start > 0 else 0)
    for mid, count in zip(path[start:], stored[start:], strict=True):
        cleared = clearings.get(mid)
        total += count - (cleared.tokens_reclaimed if cleared is not None else 0)
    return total


def choose(
    summaries: Sequence[SummaryRec],
    path: Sequence[int],
    stored: Sequence[int],
    clearings: dict[int, ClearingRec],
    budget: int | None,
    context: Context | None,
) -> Choice:
    """The summary a request on ``path`` uses: the newest on the branch when it is in use or the
    rules say to use it now; else the newest in use, with the clearings recorded before the
    ready one. Without ``context`` (a request as of a past moment, a read for export) a ready
    summary is not used."""
    on_path = set(path)
    newest = applicable_summary(summaries, on_path)
    if newest is None or not newest.pending:
        return Choice(summary=newest, clearings=clearings)
    in_use = applicable_summary([s for s in summaries if not s.pending], on_path)
    earlier = clearings
    if context is not None and newest.created_at is not None:
        earlier = context.clearings_before(newest.created_at)
    if context is None:
        return Choice(summary=in_use, clearings=earlier, waiting=newest, reason=rules.WAITS)
    grown = 0
    if context.sent_leaf in on_path:
        at = list(path).index(context.sent_leaf) + 1
        grown = sum(stored[at:])
    moment = rules.Moment(
        rules=context.rules,
        idle_seconds=context.idle_seconds,
        without=sent_tokens(path, stored, in_use, earlier),
        with_summary=sent_tokens(path, stored, newest, clearings),
        budget=budget - context.fixed if budget is not None else 2**62,
        next_step=grown,
        horizon=context.horizon,
    )
    decided = rules.activate(moment)
    if decided.use:
        return Choice(summary=newest, clearings=clearings, activated=newest, reason=decided.reason)
    return Choice(summary=in_use, clearings=earlier, waiting=newest, reason=decided.reason)


def context_for(
    session: Any,
    conversation_id: str,
    settings: Any,
    model: str,
    profile: Profile | None,
    now: datetime,
    *,
    as_of: datetime | None = None,
) -> Context | None:
    """What the choice knows for a request built at ``now`` in ``session``: the model's cache
    rules, ``settings.activation_horizon_requests``, the idle time since the last request was
    assembled, that request's leaf and the fixed parts it carried. A request ``as_of`` a past
    moment gets one only when no request was assembled after that moment (else what was in use
    then is what the summaries recorded: None)."""
    last = profile.assembled_at if profile is not None else None
    if as_of is not None and last is not None and last > as_of:
        return None
    sent = profile.sent if profile is not None else None
    parts = profile.parts if profile is not None else None

    def clearings_before(moment: datetime) -> dict[int, ClearingRec]:
        return compressed.load_clearings(session, conversation_id, as_of, waiting_since=moment)

    return Context(
        rules=rules.cache_rules(model, retention=settings.prompt_cache_retention),
        horizon=settings.activation_horizon_requests,
        idle_seconds=(now - last).total_seconds() if last is not None else None,
        sent_leaf=sent.leaf_id if sent is not None else None,
        clearings_before=clearings_before,
        fixed=parts.total if parts is not None else 0,
    )
