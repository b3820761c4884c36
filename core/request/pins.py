"""Pinned messages in the request view (pure).

A pinned message is sent verbatim in every request of a branch that holds it:

- in its place while its place is sent. Its unit (the message, or the assistant tool call with
  all its results when the pin is a call or a result) is never left out to fit the budget,
  never shortened, and any clearing recorded for the message before the pin does not apply
  (``effective_clearings``); when older history around it is left out, it is still sent, in
  order, after the note that says so;
- right after the summary, in branch order, once a summary covers it (``block``): a user or
  assistant message as stored; a tool call or a tool result as the text the text-only rendering
  gives it (``core.request.render``), since a call and its result cannot stand apart from each
  other after the summary.

Pinned tokens are fixed parts of the budget: they are counted before any history is fitted.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from recap.core.counting import reasoning
from recap.core.request import render
from recap.core.values.records import ClearingRec, Msg

# The clearing a pin does not undo: an old assistant turn's thinking is not sent back to the
# provider, pinned or not (``core.request.assembly.REASONING_CLEARING``).
KEPT_REASONS = frozenset({"reasoning"})


def effective_clearings(
    clearings: Mapping[int, ClearingRec], pinned: Collection[int]
) -> Mapping[int, ClearingRec]:
    """The clearings that apply while ``pinned`` are pinned: a pinned message is sent as stored,
    so a clearing recorded for it (a placeholder, aged media, a shortened result) does not
    apply, and applies again once it is unpinned (clearings stay recorded, one-way)."""
    if not pinned or not any(mid in clearings for mid in pinned):
        return clearings
    return {
        mid: clearing
        for mid, clearing in clearings.items()
        if mid not in pinned or clearing.reason in KEPT_REASONS
    }


def summarized(pinned: Sequence[Msg], sent_ids: Collection[int]) -> list[Msg]:
    """The pinned messages whose place the request does not send (covered by the summary, or
    left unread by the caller), in branch order: the ones ``block`` sends after the summary."""
    return [m for m in pinned if m.id not in sent_ids]


def block_message(message: Msg, family: str, *, text_only: bool) -> dict[str, Any]:
    """One pinned message as it is sent right after the summary."""
    out = message.to_openai()
    if message.role == "tool":
        return render.text_only_results([out])
    if message.tool_calls:
        return render.text_only_call(out)
    if message.extra or message.content_parts:
        out = reasoning.as_sent(out, family, in_progress=False, text_only=text_only)
    return out


def block(messages: Sequence[Msg], family: str, *, text_only: bool) -> list[dict[str, Any]]:
    """The pinned messages ``summarized`` gives, as sent after the summary."""
    return [block_message(m, family, text_only=text_only) for m in messages]
