"""Plain, immutable copies of stored rows: what ``core``'s pure functions take and return."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

SYSTEM_ROLES = ("system", "developer")  # the roles whose text is the instructions, not a turn
ROLES = (*SYSTEM_ROLES, "user", "assistant", "tool")


class Msg(NamedTuple):
    """One stored message, as the request view and the planners see it (a named tuple: the
    request path builds thousands of them, and a tuple is built several times faster than a
    frozen dataclass)."""

    id: int
    parent_id: int | None
    role: str
    content: str | None
    tokens: int
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    content_parts: tuple[Any, ...] | None = None
    extra: dict[str, Any] | None = None
    output_path: str | None = None
    original_bytes: int | None = None

    @property
    def tool_call_ids(self) -> tuple[str, ...]:
        """The ids of the calls this (assistant) message makes."""
        return tuple(str(call.get("id", "")) for call in self.tool_calls)

    def to_openai(self) -> dict[str, Any]:
        """The message in OpenAI chat format, as it was imported (no Recap fields)."""
        out: dict[str, Any] = {"role": self.role}
        if self.extra:
            out.update(self.extra)
        out["content"] = (
            list(self.content_parts) if self.content_parts is not None else self.content
        )
        if self.tool_calls:
            out["tool_calls"] = list(self.tool_calls)
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SummaryRec:
    """A stored summary: it stands in for its branch up to ``cutoff_message_id``."""

    id: int
    cutoff_message_id: int
    previous_summary_id: int | None
    text: str
    tokens: int
    model: str = ""
    identifier_retention: float = 1.0
    created_at: datetime | None = None
    # ready but not in use yet: requests are built with the summary before it until the
    # activation rules say otherwise (``core.decision.activation``)
    pending: bool = False
    # the provider's compaction of the same span, when a run got one (JSON text of a list of
    # provider items: ``core.compression.provider``)
    provider_items: str | None = None


# The stages of a clearing row (one row per message and stage, one-way): a tool result goes
# full -> ``aged`` (sent as its head and tail) -> ``cleared`` (its placeholder), or straight to
# ``cleared``; every other record of a message (a result sent shortened, media or reasoning no
# longer sent) is a ``cleared`` row too. ``arguments`` is an assistant message whose old tool-call
# arguments are sent shortened: an aspect of its own, beside any other row of the message.
AGED, CLEARED, ARGUMENTS = "aged", "cleared", "arguments"
STAGES = (AGED, CLEARED, ARGUMENTS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearingRec:
    """How a message renders from now on (its recorded steps merged: ``merge_step``).

    ``tokens_reclaimed`` is what the message's recorded state saves against its stored count,
    all aspects together: its result (aged, cleared, shortened), media or reasoning (the
    ``cleared`` or ``aged`` row) plus its shortened arguments (``arguments_tokens``, 0 when
    none). ``stage`` is the furthest step: ``cleared`` over ``aged``, ``arguments`` alone when
    that is the only one. ``kept_chars`` is the character cap an aged result renders within."""

    message_id: int
    reason: str
    tokens_reclaimed: int = 0
    stage: str = CLEARED
    arguments_tokens: int = 0
    kept_chars: int | None = None

    @property
    def aged(self) -> bool:
        """A tool result sent as its head and tail (aged, not cleared yet)."""
        return self.stage == AGED

    @property
    def arguments_only(self) -> bool:
        """Only the message's tool-call arguments are shortened: its content is as stored."""
        return self.stage == ARGUMENTS


def merge_step(
    current: ClearingRec | None,
    message_id: int,
    reason: str,
    tokens_reclaimed: int,
    stage: str = CLEARED,
    kept_chars: int | None = None,
) -> ClearingRec:
    """``current`` with one more recorded row (``tokens_reclaimed`` is the row's own saving
    against the stored count), whatever order the rows come in: a ``cleared`` row supersedes an
    ``aged`` one (never the other way: one-way, even when a late ``aged`` row lands after a
    clearing), and ``arguments`` adds to either."""
    if stage not in STAGES:
        raise ValueError(f"unknown clearing stage {stage!r} (expected one of {STAGES})")
    if current is None:
        if stage == ARGUMENTS:
            return ClearingRec(
                message_id=message_id,
                reason=reason,
                tokens_reclaimed=tokens_reclaimed,
                stage=ARGUMENTS,
                arguments_tokens=tokens_reclaimed,
            )
        chars = kept_chars if stage == AGED else None
        return ClearingRec(
            message_id=message_id,
            reason=reason,
            tokens_reclaimed=tokens_reclaimed,
            stage=stage,
            arguments_tokens=0,
            kept_chars=chars,
        )
    arguments = current.arguments_tokens
    if stage == ARGUMENTS:
        if arguments or current.stage == ARGUMENTS:  # recorded already
            return current
        return ClearingRec(
            message_id=message_id,
            reason=current.reason,
            tokens_reclaimed=current.tokens_reclaimed + tokens_reclaimed,
            stage=current.stage,
            arguments_tokens=tokens_reclaimed,
            kept_chars=current.kept_chars,
        )
    if current.stage == CLEARED or (current.stage == AGED and stage == AGED):
        return current  # the furthest step is recorded already
    chars = kept_chars if stage == AGED else None
    return ClearingRec(
        message_id=message_id,
        reason=reason,
        tokens_reclaimed=tokens_reclaimed + arguments,
        stage=stage,
        arguments_tokens=arguments,
        kept_chars=chars,
    )


def steps_of(clearings: Iterable[ClearingRec]) -> int:
    """A count that grows with every recorded step that changes how a message renders: a
    cleared message counts 2, an aged one 1, shortened arguments 1 more (so an aged result
    cleared adds one, as a new clearing adds at least one)."""
    weight = {CLEARED: 2, AGED: 1, ARGUMENTS: 0}
    return sum(weight[c.stage] + (1 if c.arguments_tokens else 0) for c in clearings)
