"""The branch as a timeline (pure): each message with its state in the next request, and each
summary as a band over the messages it covers.

The states come from the stored records and the assembled request (``core.request.assembly``'s
result), never from a second reading of the rules:

- ``pinned``: sent as stored whatever is summarized or cleared (``core.request.pins``): in its
  place, or right after the summary that covers it;
- ``summarized``: on the branch at or before the cutoff of the summary the request sends;
- ``aged``: a tool result sent as its head and tail, or a call with its old arguments shortened
  (the aged stage), with the reason of the moment that aged it;
- ``cleared``: a clearing is recorded for it (a tool result sent as its placeholder, media sent
  as a text part, reasoning no longer sent), with the clearing's reason;
- ``omitted``: the request leaves it out (``dropped_message_ids``: it did not fit, or a result
  answers no call on the sent branch);
- ``full``: sent as stored.

The root system prompt is ``full`` (it is sent as the system prompt even under a summary).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from recap.core.values.records import ClearingRec, Msg, SummaryRec

FULL, AGED, CLEARED, SUMMARIZED = "full", "aged", "cleared", "summarized"
PINNED, OMITTED = "pinned", "omitted"
PREVIEW_CHARS = 240  # the line a timeline entry shows
# Entries shown of one summary's span, and of one run of omitted messages (the newest of them):
# a page stays a few hundred kilobytes however long the conversation; `recap export` has the rest.
SHOWN_PER_RUN = 200
DETAIL_CHARS = 4_000  # what an opened entry shows of a long message (the rest: recap export)


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One message of the branch as the timeline shows it (its text is made when shown)."""

    message: Msg
    state: str
    sent_tokens: int  # what the request sends of it (0 when summarized or omitted)
    reason: str | None = None  # the clearing's reason
    created_at: datetime | None = None
    source: str | None = None  # an attached item's provenance (``conversation:message``)

    @property
    def id(self) -> int:
        return self.message.id

    @property
    def role(self) -> str:
        return self.message.role

    @property
    def name(self) -> str | None:
        return self.message.name

    @property
    def tokens(self) -> int:
        """The stored count."""
        return self.message.tokens

    @property
    def preview(self) -> str:
        return _clip(" ".join(message_text(self.message).split()), PREVIEW_CHARS)

    @property
    def detail(self) -> str:
        return _clip(message_text(self.message), DETAIL_CHARS)


@dataclass(slots=True, kw_only=True)
class Band:
    """A summary and the messages it covers on this branch."""

    summary: SummaryRec
    entries: list[Entry] = field(default_factory=list)
    in_effect: bool = False  # the summary the next request sends (the others were folded in)
    first_id: int | None = None  # the first message it covers on this branch
    covered: int = 0  # messages it covers (``entries`` holds the newest ``SHOWN_PER_RUN``)

    @property
    def hidden(self) -> int:
        return self.covered - len(self.entries)


@dataclass(frozen=True, slots=True)
class Gap:
    """Older messages of a run of omitted ones, left off the page."""

    count: int
    first_id: int
    last_id: int


Item = Entry | Band | Gap


def message_text(message: Msg) -> str:
    """What a message says, as plain text: its content or its text parts, and its calls."""
    if message.content_parts is not None:
        pieces = []
        for part in message.content_parts:
            if isinstance(part, dict) and part.get("type") == "text":
                pieces.append(str(part.get("text") or ""))
            elif isinstance(part, dict):
                pieces.append(f"[{part.get('type', 'part')}]")
        text = "\n".join(pieces)
    else:
        text = message.content or ""
    calls = [_call_text(call) for call in message.tool_calls]
    return "\n".join(piece for piece in (text, *calls) if piece)


def _call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"→ {function.get('name', '?')}({arguments})"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def states(
    branch: Sequence[Msg],
    *,
    summary_cutoff: int | None,
    clearings: Mapping[int, ClearingRec],
    dropped: Collection[int],
    pinned: Collection[int] = frozenset(),
) -> dict[int, tuple[str, str | None]]:
    """Each message's state and, when cleared, the clearing's reason (see the module
    docstring); ``summary_cutoff`` is the cutoff of the summary the request sends."""
    covered = summary_cutoff is not None
    root = branch[0].id if branch and branch[0].parent_id is None else None
    out: dict[int, tuple[str, str | None]] = {}
    dropped_set = set(dropped)
    for message in branch:
        clearing = clearings.get(message.id)
        if message.id == root and message.role in ("system", "developer"):
            out[message.id] = (FULL, None)
        elif message.id in pinned:
            out[message.id] = (PINNED, None)
        elif covered:
            out[message.id] = (SUMMARIZED, None)
        elif message.id in dropped_set:
            out[message.id] = (OMITTED, None)
        elif clearing is not None and (clearing.aged or clearing.arguments_only):
            out[message.id] = (AGED, clearing.reason)
        elif clearing is not None:
            out[message.id] = (CLEARED, clearing.reason)
        else:
            out[message.id] = (FULL, None)
        if message.id == summary_cutoff:
            covered = False
    return out


def timeline(
    branch: Sequence[Msg],
    *,
    summaries: Sequence[SummaryRec],
    summary_in_effect: int | None,
    clearings: Mapping[int, ClearingRec],
    dropped: Collection[int],
    created: Mapping[int, datetime] | None = None,
    pinned: Collection[int] = frozenset(),
    provenance: Mapping[int, str] | None = None,
) -> list[Item]:
    """The branch, root first, with the messages each summary on it covers gathered in its band
    (a later summary's band starts after the cutoff of the one before it)."""
    positions = {message.id: index for index, message in enumerate(branch)}
    on_branch = sorted(
        (s for s in summaries if s.cutoff_message_id in positions),
        key=lambda s: positions[s.cutoff_message_id],
    )
    effect = next((s for s in on_branch if s.id == summary_in_effect), None)
    found = states(
        branch,
        summary_cutoff=effect.cutoff_message_id if effect is not None else None,
        clearings=clearings,
        dropped=dropped,
        pinned=frozenset(pinned),
    )
    ends = {s.cutoff_message_id: s for s in on_branch}
    items: list[Item] = []
    band: Band | None = (
        Band(summary=on_branch[0], in_effect=on_branch[0] is effect) if on_branch else None
    )
    for message in branch:
        entry = _entry(message, found[message.id], clearings, (created or {}).get(message.id))
        if provenance and message.id in provenance:
            entry = replace(entry, source=provenance[message.id])
        if band is not None and not (message.id == branch[0].id and entry.role == "system"):
            band.entries.append(entry)
        else:
            items.append(entry)
        closing = ends.get(message.id)
        if closing is not None and band is not None:
            items.append(band)
            following = [
                s for s in on_branch if positions[s.cutoff_message_id] > positions[message.id]
            ]
            band = (
                Band(summary=following[0], in_effect=following[0] is effect) if following else None
            )
    if band is not None:  # a summary past the leaf cannot be on the branch; nothing is left open
        items.append(band)
    return _bounded(items)


def _bounded(items: list[Item]) -> list[Item]:
    """The timeline with each band's entries, and each run of omitted entries, cut to their
    newest ``SHOWN_PER_RUN``."""
    out: list[Item] = []
    run: list[Entry] = []

    def flush() -> None:
        if len(run) > SHOWN_PER_RUN:
            cut = len(run) - SHOWN_PER_RUN
            out.append(Gap(cut, run[0].id, run[cut - 1].id))
            out.extend(run[cut:])
        else:
            out.extend(run)
        run.clear()

    for item in items:
        if isinstance(item, Entry) and item.state == OMITTED:
            run.append(item)
            continue
        flush()
        if isinstance(item, Band):
            item.first_id = item.entries[0].id if item.entries else None
            item.covered = len(item.entries)
            del item.entries[: max(item.covered - SHOWN_PER_RUN, 0)]
        out.append(item)
    flush()
    return out


def _entry(
    message: Msg,
    state: tuple[str, str | None],
    clearings: Mapping[int, ClearingRec],
    created: datetime | None,
) -> Entry:
    name, reason = state
    clearing = clearings.get(message.id)
    reclaimed = clearing.tokens_reclaimed if clearing is not None and name != PINNED else 0
    sent = 0 if name in (SUMMARIZED, OMITTED) else max(message.tokens - reclaimed, 0)
    return Entry(message=message, state=name, sent_tokens=sent, reason=reason, created_at=created)
