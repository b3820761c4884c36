"""Stage 7, older history: the newest run of older units that fits the room left, added newest
first and stopping at the first unit that does not fit (stop, not skip: one contiguous newest
run keeps the prompt cache useful), with a gap note where older ones are left out; then the
history as sent, around the context files and the tail."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from recap.core.request.assembly.given import Given, thinking_from
from recap.core.request.assembly.parts import ADDED_ROLE, GAP_NOTE, count
from recap.core.request.assembly.rendering import extend, unique_call_ids
from recap.core.values.draft import Draft, Fitted, Unit


def stage(given: Given, draft: Draft) -> Draft:
    """The history fitted to the room left; a ``BudgetError`` when the fresh call ids it needs
    leave the tail no room."""
    fitted = fit_history(given, draft, cut=bool(given.stored.omitted))
    draft = replace(draft, fitted=fitted)
    tally = draft.tally
    if tally.fixed + draft.fitted_tokens() + tally.context > given.budget:  # fresh call ids did it
        tail_tokens = draft.tail.tokens + fitted.renamed
        raise given.tail_error(tail_tokens, tally.fixed)
    return draft


def fit_history(given: Given, draft: Draft, *, cut: bool) -> Fitted:
    """The newest run of older units that fits the draft's room, with the parts around it;
    fitted once more with less room when fresh call ids (``unique_call_ids``) take it over."""
    room = draft.room
    fitted = history_within(given, draft, room, cut=cut)
    if fitted.renamed and fitted.kept_tokens + fitted.gap_tokens + fitted.renamed > room:
        fitted = history_within(given, draft, room - fitted.renamed, cut=cut)
    return fitted


def history_within(
    given: Given, draft: Draft, room: int, *, cut: bool, start: int | None = None
) -> Fitted:
    """The history as sent when the older units from ``start`` on are kept (by default the
    newest run that fits ``room``): the gap note, the pinned units before the run, the run, the
    context files and the tail, with call ids made unique when some repeat."""
    older, encoding = draft.history.older, given.encoding
    if start is None:
        start, gap_tokens = _fit_older(older, room, encoding, cut=cut)
    else:  # a start the byte guard chose: the gap note stands for what it left out
        gap_tokens = count(ADDED_ROLE, GAP_NOTE, encoding)
    messages: list[dict[str, Any]] = (
        [{"role": ADDED_ROLE, "content": GAP_NOTE}] if gap_tokens else []
    )
    marks: list[int] | None = None
    cleared = draft.cleared
    if given.pins:  # pinned units before the kept run are sent all the same, in order
        marks = []
        held = [unit for unit in older[:start] if unit.pinned]
        extend(messages, held, given, cleared, in_progress=False, marks=marks)
    recent = max(thinking_from(given, older), start)  # older turns within the thinking window
    extend(messages, older[start:recent], given, cleared, in_progress=False, marks=marks)
    extend(messages, older[recent:], given, cleared, in_progress=True, marks=marks)
    messages.extend(draft.context.messages)
    extend(messages, draft.history.tail, given, cleared, in_progress=True, marks=marks)
    renamed = unique_call_ids(messages, encoding) if draft.history.repeated_call_ids else 0
    return Fitted(
        kept_from=start,
        gap_tokens=gap_tokens,
        kept_tokens=sum(unit.tokens for unit in older[start:] if not unit.pinned),
        messages=messages,
        renamed=renamed,
        pinned_at=tuple(marks or ()),
    )


def _fit_older(older: Sequence[Unit], room: int, encoding: str, *, cut: bool) -> tuple[int, int]:
    """Where the kept older history starts, and the tokens of the gap note (0 when none).

    When older messages are left out (``cut``: some were already omitted by the caller), a short
    note says so where they were: the model learns that the history has a gap, and the first
    turn after the system prompt is a user turn.
    """
    start = _kept_from(older, room)
    if start == 0 and not cut:
        return 0, 0
    gap_tokens = count(ADDED_ROLE, GAP_NOTE, encoding)
    if gap_tokens > room:
        return len(older), 0
    return _kept_from(older, room - gap_tokens), gap_tokens


def _kept_from(older: Sequence[Unit], room: int) -> int:
    """The start of the newest contiguous run of units that fits in ``room`` tokens (a pinned
    unit is paid for as a fixed part: it takes no room, and the run goes on past it)."""
    start = len(older)
    while start > 0 and (older[start - 1].pinned or older[start - 1].tokens <= room):
        start -= 1
        if not older[start].pinned:
            room -= older[start].tokens
    return start
