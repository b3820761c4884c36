"""Stage 5, the tail (the last user message and everything after it) within what the fixed parts
leave: the user's memory left out first when the whole would not fit, the summary shortened
first when the whole would crowd the newest turn out, the tail's
results shortened or its older steps left out (``fit_tail``), the summary cut to its note when
the tail still does not fit; else a ``BudgetError``: the tail is never cut silently."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from recap.core.request import shorten
from recap.core.request.assembly.given import Given
from recap.core.request.assembly.parts import ADDED_ROLE, GAP_NOTE, count
from recap.core.values.draft import Draft, Records, TailFit, Unit
from recap.core.values.records import ClearingRec, Msg


class FitTail(NamedTuple):
    """What ``fit_tail`` made of the tail: the tail as sent, the steps that join the older
    units, the clearings with the shortened results, the shortenings to record, and the ids of
    the steps left out after a user message."""

    tail: Sequence[Unit]
    older: Sequence[Unit]
    clearings: Mapping[int, ClearingRec]
    shortened: Records
    cut_steps: Sequence[int]


def stage(given: Given, draft: Draft) -> Draft:
    """The tail fitted, the summary shortened or cut for it, and the room left for history."""
    budget, encoding = given.budget, given.encoding
    tally, history = draft.tally, draft.history
    if tally.memory and tally.fixed + tokens_of(history.tail) > budget:
        # the user's memory goes first: the newest turn is never cut to keep it
        draft = replace(
            draft, ends=replace(draft.ends, memory=None), tally=replace(tally, memory=0)
        )
        tally = draft.tally
    others = tally.fixed - tally.summary  # the fixed parts but the summary
    summary, summary_tokens, summary_cut = draft.ends.summary, tally.summary, False
    if summary is not None and tally.fixed + tokens_of(history.tail) > budget:
        summary, cut_tokens = _shortened_summary(
            summary, summary_tokens, budget - others, history.tail, encoding
        )
        summary_cut = cut_tokens < summary_tokens
        summary_tokens = cut_tokens
    fit = fit_tail(
        history.tail, budget - others - summary_tokens, draft.cleared, encoding, given.pins
    )
    tail_tokens = tokens_of(fit.tail)
    if others + summary_tokens + tail_tokens > budget and summary is not None:
        keep = budget - others - tail_tokens
        if keep > 0:  # down to its note alone: the request says the summary was cut
            summary, summary_tokens = _summary_cut_to(summary, keep, encoding)
            summary_cut = True
    fixed = others + summary_tokens
    if fixed + tail_tokens > budget:
        raise given.tail_error(tail_tokens, fixed)
    return replace(
        draft,
        ends=replace(draft.ends, summary=summary),
        tally=replace(tally, summary=summary_tokens),
        history=replace(
            history,
            older=[*history.older, *fit.older] if fit.older else history.older,
            tail=fit.tail,
        ),
        cleared=fit.clearings,
        tail=TailFit(
            tokens=tail_tokens,
            shortened=fit.shortened,
            cut_steps=fit.cut_steps,
            cut=bool(fit.shortened or fit.older or fit.cut_steps),
            summary_cut=summary_cut,
        ),
        room=budget - fixed - tail_tokens,
    )


def tokens_of(units: Sequence[Unit]) -> int:
    """The units' tokens, as counted so far."""
    return sum(unit.tokens for unit in units)


def fit_tail(
    tail: Sequence[Unit],
    room: int,
    clearings: Mapping[int, ClearingRec],
    encoding: str,
    pins: Collection[int] = frozenset(),
) -> FitTail:
    """The tail within ``room`` tokens when it can be made to fit, cheapest loss first:

    1. a tool result larger than half the room is sent as its head and tail at that size;
    2. the tool results are cut to one common size, the largest first, when that fits: every
       step is kept, each result shortened to its head and tail (``shared_cut``);
    3. else the oldest steps after the last user message are left out (reported as dropped,
       like older history, a gap note in their place), and the remaining tool results are cut
       to one common size.

    The last user message and the newest step are always kept, and so are the steps holding a
    pinned message, whose results are never cut either (``pins``). When no user message leads the
    tail (a summary cut inside an agent turn), the steps left out are the oldest of the history
    itself: they are returned to join the older units (which the history stage fits and notes),
    so the request is the same whether a caller left such rows unread or not."""
    if not tail or tokens_of(tail) <= room:
        return FitTail(tail=tail, older=(), clearings=clearings, shortened=(), cut_steps=())
    half = max(room // 2, shorten.MIN_KEPT_TOKENS)
    shared = shared_cut(tail, room, clearings, half, pins)
    if shared is not None:
        return shared
    head = 1 if tail[0].is_user else 0
    middle, newest = tail[head:-1], tail[-1:] if len(tail) > head else []
    note: dict[str, Any] = {"role": ADDED_ROLE, "content": GAP_NOTE}
    gap = Unit((note,), (), count(ADDED_ROLE, GAP_NOTE, encoding) if head else 0, False)
    left = room - gap.tokens
    always = (*tail[:head], *newest, *(unit for unit in middle if unit.pinned))
    left -= sum(_capped(unit, clearings, half, pins) for unit in always)
    kept = len(middle)  # the newest steps that fit once results are capped at half the room
    while kept and (
        middle[kept - 1].pinned or _capped(middle[kept - 1], clearings, half, pins) <= left
    ):
        if not middle[kept - 1].pinned:
            left -= _capped(middle[kept - 1], clearings, half, pins)
        kept -= 1
    cut = [unit for unit in middle[:kept] if not unit.pinned]
    middle = [*(unit for unit in middle[:kept] if unit.pinned), *middle[kept:]]
    tail = [*tail[:head], *([gap] if head and cut else []), *middle, *newest]
    tail, clearings, capped = _shorten_tail(tail, clearings, cap=half, pins=pins)
    extra: Records = ()
    if tokens_of(tail) > room:
        excess = tokens_of(tail) - room
        tail, clearings, extra = _shorten_tail(tail, clearings, excess=excess, pins=pins)
    if head and len(tail) > 1 and tokens_of(tail) > room:
        # last resort: the user message alone (with the pinned steps), the turn's other steps
        # reported as left out
        cut = [*cut, *(unit for unit in tail[1:] if unit is not gap and not unit.pinned)]
        held = [unit for unit in tail[1:] if unit.pinned]
        tail = [*tail[:1], *([gap] if held else []), *held]
    sent = {mid for unit in tail for mid in unit.ids}
    done = tuple((mid, n) for mid, n in dict((*capped, *extra)).items() if mid in sent)
    if head:
        steps = [mid for unit in cut for mid in unit.ids]
        return FitTail(tail=tail, older=(), clearings=clearings, shortened=done, cut_steps=steps)
    return FitTail(tail=tail, older=cut, clearings=clearings, shortened=done, cut_steps=())


def shared_cut(
    tail: Sequence[Unit],
    room: int,
    clearings: Mapping[int, ClearingRec],
    half: int,
    pins: Collection[int] = frozenset(),
) -> FitTail | None:
    """The whole tail within ``room`` with its tool results cut to one common size (those above
    ``half`` to it first, then the largest down to the size that saves enough): every step and
    every result kept, each call with its result. None when even the smallest size does not
    fit."""
    cut, clearings, capped = _shorten_tail(tail, clearings, cap=half, pins=pins)
    extra: Records = ()
    if tokens_of(cut) > room:
        excess = tokens_of(cut) - room
        cut, clearings, extra = _shorten_tail(cut, clearings, excess=excess, pins=pins)
    if tokens_of(cut) > room:
        return None
    done = tuple(dict((*capped, *extra)).items())
    return FitTail(tail=cut, older=(), clearings=clearings, shortened=done, cut_steps=())


def _shortened_summary(
    message: dict[str, Any], count: int, room: int, tail: Sequence[Unit], encoding: str
) -> tuple[dict[str, Any], int]:
    """The summary message within what the tail leaves of ``room`` (but at least half of it):
    its head and tail, when the whole would crowd the newest turn out. Its tokens."""
    keep = max(room - tokens_of(tail), room // 2, shorten.MIN_KEPT_TOKENS)
    if keep >= count:
        return message, count
    return _summary_cut_to(message, keep, encoding)


def _summary_cut_to(
    message: dict[str, Any], keep: int, encoding: str
) -> tuple[dict[str, Any], int]:
    """The summary message as its head and tail within about ``keep`` tokens, and its tokens."""
    text = shorten.head_and_tail(message["content"], keep, encoding, what="summary")
    return {**message, "content": text}, count(ADDED_ROLE, text, encoding)


def _capped(
    unit: Unit, clearings: Mapping[int, ClearingRec], cap: int, pins: Collection[int]
) -> int:
    """The unit's tokens once its tool results above ``cap`` (whole or already shortened, not
    pinned) are cut to it."""
    over = 0
    for item in unit.items:
        if not isinstance(item, Msg) or item.role != "tool" or item.id in pins:
            continue
        clearing = clearings.get(item.id)
        if clearing is None or clearing.reason == shorten.SHORTENED or clearing.aged:
            size = item.tokens - (clearing.tokens_reclaimed if clearing is not None else 0)
            over += max(size - cap, 0)
    return unit.tokens - over


def _shorten_tail(
    tail: Sequence[Unit],
    clearings: Mapping[int, ClearingRec],
    *,
    excess: int = 0,
    cap: int | None = None,
    pins: Collection[int] = frozenset(),
) -> tuple[Sequence[Unit], Mapping[int, ClearingRec], Records]:
    """Cut the tool results of the tail above ``cap`` to it, or (no cap) the largest to one
    common size so that ``excess`` tokens go (``core.request.shorten``); the tail with those
    units counted anew, the clearings with them added and the new ones to record. Nothing
    changes when even the smallest size would not save enough: the error then names the part
    that is too large. Pinned results are never cut."""
    found = [
        (position, item, item.tokens - (c.tokens_reclaimed if c is not None else 0))
        for position, unit in enumerate(tail)
        for item in unit.items
        if isinstance(item, Msg)
        and item.role == "tool"
        and item.id not in pins
        and ((c := clearings.get(item.id)) is None or c.reason == shorten.SHORTENED or c.aged)
    ]
    if cap is None:
        cap = shorten.kept_tokens_for([size for _, _, size in found], excess)
    if cap is None:
        return tail, clearings, ()
    added: dict[int, ClearingRec] = {}
    less: dict[int, int] = {}  # tokens taken off the unit at each position
    for position, item, size in found:
        if size > cap:
            added[item.id] = ClearingRec(
                message_id=item.id, reason=shorten.SHORTENED, tokens_reclaimed=item.tokens - cap
            )
            less[position] = less.get(position, 0) + size - cap
    if less:
        tail = [
            unit._replace(tokens=unit.tokens - less[position]) if position in less else unit
            for position, unit in enumerate(tail)
        ]
    records = tuple((mid, c.tokens_reclaimed) for mid, c in added.items())
    return tail, {**clearings, **added}, records
