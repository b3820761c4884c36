"""Plain, immutable copies of stored rows: what ``core``'s pure functions take and return."""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class ClearingRec:
    """A tool result that renders as its placeholder."""

    message_id: int
    reason: str
    tokens_reclaimed: int = 0
