"""The timeline of a branch (pure): each message's state in the request, each summary's span.

``derive`` takes what ``core.request.assembly.assemble`` returned for a branch, with the branch
itself (every message, root first), the summaries and the clearings that request was built from,
and says for each message how the request holds it:

- ``full``: sent as stored (the stored system prompt included);
- ``aged``: sent aged: a tool result as its head and tail (the aged stage), an assistant message
  with its old tool-call arguments shortened, or a message with its media as placeholders
  (recorded as aged, or aged by this request);
- ``cleared``: a tool result sent as its placeholder (or shortened to fit the newest step);
- ``summarized``: covered by the summary the request sends;
- ``pinned``: sent as stored whatever is summarized or cleared (``core.request.pins``): in its
  place, or right after the summary that covers it;
- ``omitted``: left out (to fit the budget, an orphan result, a stored prompt replaced).

``sent_tokens`` is what the message costs in the request as stored counts go (a cleared or aged
result at its recorded size, nothing for a summarized or omitted one).

The request's totals are in the provider's tokens, the terms of the window and of ``recap stats``:
``request_tokens`` and ``budget`` are Recap's estimates scaled by the calibration factor (the
latest provider reading over Recap's count, ``core.counting.budget``), so the budget is never
above the window; the estimates themselves are kept beside them (``estimated``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from recap.core.counting import media
from recap.core.request.assembly import REASONING_CLEARING, AssembledRequest, stored_prompt
from recap.core.values.records import ClearingRec, Msg, SummaryRec

FULL, AGED, CLEARED, SUMMARIZED, PINNED, OMITTED = (
    "full",
    "aged",
    "cleared",
    "summarized",
    "pinned",
    "omitted",
)
STATES = (FULL, AGED, CLEARED, SUMMARIZED, PINNED, OMITTED)


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageState:
    """One message of the branch and how the request holds it."""

    id: int
    role: str
    state: str
    tokens: int  # as stored
    sent_tokens: int  # as the request holds it
    reason: str | None = None  # the clearing's reason, when one applies
    summary_id: int | None = None  # the summary covering it
    tool: str | None = None  # a tool result's tool name
    ref: str | None = None  # what ``Recap.recall`` takes to bring it back, when it is not full
    source: str | None = None  # an attached item's provenance (``conversation:message``)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "role": self.role,
            "state": self.state,
            "tokens": self.tokens,
            "sent_tokens": self.sent_tokens,
        }
        for key in ("reason", "summary_id", "tool", "ref", "source"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SummarySpan:
    """A summary on the branch and the messages it covers (after the previous one's cutoff)."""

    id: int
    first_message_id: int
    cutoff_message_id: int
    messages: int
    tokens: int
    sent: bool  # the summary the request sends (the newest in use on the branch)
    created_at: str = ""
    ref: str | None = None
    # ready but not in use yet (``core.decision.activation``): the request sends the one before
    waiting: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "first_message_id": self.first_message_id,
            "cutoff_message_id": self.cutoff_message_id,
            "messages": self.messages,
            "tokens": self.tokens,
            "sent": self.sent,
            "created_at": self.created_at,
        }
        if self.waiting:
            out["waiting"] = True
        if self.ref is not None:
            out["ref"] = self.ref
        return out


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """A branch's messages with their states, its summaries with their spans, and the
    request's totals: ``request_tokens`` and ``budget`` in provider tokens (``estimated_*``:
    as Recap counts them, before the calibration factor)."""

    messages: list[MessageState]
    summaries: list[SummarySpan]
    request_tokens: int
    budget: int
    forgotten_files: list[str] = field(default_factory=list)
    window: int = 0
    calibration: float = 1.0
    estimated_request_tokens: int = 0
    estimated_budget: int = 0
    # The branch's merges (``core.storage.attachments.MergeRow.as_dict``): each commit with its
    # parents.
    merges: list[dict[str, Any]] = field(default_factory=list)

    def in_provider_tokens(self, calibration: float) -> Timeline:
        """This timeline with its totals in provider tokens: Recap's counts times
        ``calibration``, the factor the request's budget was planned with (the request rounded
        up, the budget down, so it stays within the window)."""
        return replace(
            self,
            request_tokens=math.ceil(self.estimated_request_tokens * calibration),
            budget=math.floor(self.estimated_budget * calibration),
            calibration=calibration,
        )

    def counts(self) -> dict[str, int]:
        """Messages per state (every state named, zero included)."""
        out = dict.fromkeys(STATES, 0)
        for message in self.messages:
            out[message.state] += 1
        return out

    def as_dict(self) -> dict[str, Any]:
        """The object ``recap timeline --json`` prints."""
        return {
            "messages": [m.as_dict() for m in self.messages],
            "summaries": [s.as_dict() for s in self.summaries],
            "states": self.counts(),
            "request_tokens": self.request_tokens,
            "budget": self.budget,
            "window": self.window,
            "calibration": round(self.calibration, 4),
            "estimated": {
                "request_tokens": self.estimated_request_tokens,
                "budget": self.estimated_budget,
            },
            "forgotten_files": list(self.forgotten_files),
        } | ({"merges": list(self.merges)} if self.merges else {})


Refs = Mapping[int, str]  # message id -> its recall reference


def derive(
    branch: Sequence[Msg],
    request: AssembledRequest,
    *,
    summaries: Iterable[SummaryRec] = (),
    clearings: Mapping[int, ClearingRec] | None = None,
    system_given: bool = False,
    pinned: Iterable[int] = (),
    refs: Refs | None = None,
    summary_refs: Mapping[int, str] | None = None,
) -> Timeline:
    """The timeline of ``branch`` (every message, root first) in ``request``, which was
    assembled from it with ``clearings`` and the summary ``request.summary_id`` names (one of
    ``summaries``). ``system_given``: the request replaced the stored system prompt. Its totals
    are Recap's counts (``Timeline.in_provider_tokens`` scales them)."""
    cleared = clearings or {}
    refs = refs or {}
    keep = set(pinned)
    on_branch = _summaries_on(branch, summaries)
    sent_summary = next((s for s in on_branch if s.id == request.summary_id), None)
    position = {m.id: i for i, m in enumerate(branch)}
    covered_to = position.get(sent_summary.cutoff_message_id, -1) if sent_summary else -1
    root = stored_prompt(branch)
    dropped = set(request.dropped_message_ids)
    aged_now = {mid for mid, _ in request.media_aged}
    states: list[MessageState] = []
    for index, message in enumerate(branch):
        clearing = cleared.get(message.id)
        reclaimed = clearing.tokens_reclaimed if clearing is not None else 0
        reason = clearing.reason if clearing is not None else None
        summary_id: int | None = None
        if root is not None and message.id == root.id:
            state = OMITTED if system_given else FULL
            sent = message.tokens if state == FULL else 0
        elif message.id in keep:
            state, sent = PINNED, message.tokens
        elif index <= covered_to and sent_summary is not None:
            state, sent, summary_id = SUMMARIZED, 0, sent_summary.id
        elif message.id in dropped:
            state, sent = OMITTED, 0
        elif _aged_media(message, clearing, aged_now):
            state, sent = AGED, max(message.tokens - reclaimed, 0)
            reason = reason or media.RECORDED
        elif clearing is not None and (clearing.aged or clearing.arguments_tokens):
            state, sent = AGED, max(message.tokens - reclaimed, 0)
        elif message.role == "tool" and clearing is not None and reason != REASONING_CLEARING:
            state, sent = CLEARED, max(message.tokens - reclaimed, 0)
        else:
            state = FULL
            sent = max(message.tokens - (reclaimed if reason == REASONING_CLEARING else 0), 0)
        states.append(
            MessageState(
                id=message.id,
                role=message.role,
                state=state,
                tokens=message.tokens,
                sent_tokens=sent,
                reason=reason if state in (AGED, CLEARED) else None,
                summary_id=summary_id,
                tool=message.name if message.role == "tool" else None,
                ref=refs.get(message.id) if state not in (FULL, PINNED) else None,
                source=request.provenance.get(message.id),
            )
        )
    spans = _spans(branch, on_branch, sent_summary, summary_refs or {})
    return Timeline(
        messages=states,
        summaries=spans,
        request_tokens=request.tokens.total,
        budget=request.budget,
        forgotten_files=list(request.forgotten_files),
        window=request.window,
        estimated_request_tokens=request.tokens.total,
        estimated_budget=request.budget,
    )


def _aged_media(message: Msg, clearing: ClearingRec | None, aged_now: set[int]) -> bool:
    """Whether the message is sent with its media as placeholders (recorded, or aged now)."""
    if not message.content_parts or not media.has_media(message.content_parts):
        return False
    recorded = clearing is not None and clearing.reason == media.RECORDED
    return recorded or message.id in aged_now


def _summaries_on(branch: Sequence[Msg], summaries: Iterable[SummaryRec]) -> list[SummaryRec]:
    """The summaries whose cutoff is on the branch, in cutoff order."""
    ids = {m.id for m in branch}
    return sorted(
        (s for s in summaries if s.cutoff_message_id in ids), key=lambda s: s.cutoff_message_id
    )


def _spans(
    branch: Sequence[Msg],
    on_branch: Sequence[SummaryRec],
    sent: SummaryRec | None,
    refs: Mapping[int, str],
) -> list[SummarySpan]:
    """Each summary's span: the messages after the previous summary's cutoff up to its own
    (the stored system prompt, always sent, is in none)."""
    position = {m.id: i for i, m in enumerate(branch)}
    start = 1 if stored_prompt(branch) is not None else 0
    spans: list[SummarySpan] = []
    for summary in on_branch:
        end = position[summary.cutoff_message_id]
        first = branch[min(start, end)].id
        spans.append(
            SummarySpan(
                id=summary.id,
                first_message_id=first,
                cutoff_message_id=summary.cutoff_message_id,
                messages=max(end - start + 1, 0),
                tokens=summary.tokens,
                sent=sent is not None and summary.id == sent.id,
                created_at=summary.created_at.isoformat() if summary.created_at else "",
                ref=refs.get(summary.id),
                waiting=summary.pending and not (sent is not None and summary.id == sent.id),
            )
        )
        start = end + 1
    return spans
