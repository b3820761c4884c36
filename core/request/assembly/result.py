"""The end of ``assemble``: the request the stages built, with its token breakdown and what it
left out (``AssembledRequest``)."""

from __future__ import annotations

from recap.core.request.assembly.given import Given
from recap.core.values.assembly import AssembledRequest, TokenBreakdown
from recap.core.values.draft import Draft


def result(given: Given, draft: Draft) -> AssembledRequest:
    """The request in ``draft``, with its breakdown (the stages' tally added up) and what it left
    out: messages the caller omitted, orphan results, older units and steps of the turn."""
    fitted, tally, stored, tail = draft.fitted, draft.tally, given.stored, draft.tail
    assert fitted is not None
    kept_from = fitted.kept_from
    left_out = [unit for unit in draft.history.older[:kept_from] if not unit.pinned]
    older_dropped = (mid for unit in left_out for mid in unit.ids)
    dropped = sorted([*stored.omitted, *draft.history.orphans, *older_dropped, *tail.cut_steps])
    history = draft.fitted_tokens() + tally.history + tally.pinned  # pinned ones are history
    breakdown = TokenBreakdown(
        system=tally.system,
        summary=tally.summary,
        history=history,
        context=tally.context,
        tools=tally.tools,
        reminder=tally.reminder,
        media=tally.media,
        reasoning=tally.reasoning,
        memory=tally.memory,
        total=tally.fixed + history - tally.pinned + tally.context + tally.media + tally.reasoning,
    )
    summary = stored.summary
    return AssembledRequest(
        messages=list(draft.messages),
        tokens=breakdown,
        budget=given.budget,
        window=given.target.window,
        summary_id=summary.id if summary is not None else None,
        dropped_message_ids=dropped,
        forgotten_files=list(draft.context.forgotten),
        media_aged=draft.media_aged,
        truncated=bool(stored.omitted) or kept_from > 0 or bool(tail.cut_steps) or tail.summary_cut,
        truncated_tokens=sum(unit.tokens for unit in left_out),
        reasoning_dropped=draft.reasoning_dropped,
        shortened=tail.shortened,
        fitted_tail=tail.cut,
    )
