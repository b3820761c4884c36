"""The console's rows as plain values: one line of the conversations list and a page of them,
what the list's pressure sort needs beside the rows, a compaction-log row and a provider reading
as one conversation's page shows them, and the sorts the list offers. Read by
``core.storage.console``, shown by ``workers.ui``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

SORTS = ("activity", "id", "messages", "tokens", "pressure", "failures")  # the list's sorts


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationRow:
    """One line of the conversations list."""

    id: str
    owner: str | None
    model: str
    max_input_tokens: int | None
    last_activity_at: datetime | None
    messages: int
    stored_tokens: int  # every stored message of every branch, as counted at ingest
    last_action: str | None
    last_run_at: datetime | None
    failures: int  # failed runs in the retained compaction log


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[ConversationRow]
    total: int  # conversations matching the filter, across all pages
    # With the pressure sort: each row's pressure as the sort worked it out (None: no window)
    pressures: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class PressureInputs:
    """What the pressure sort needs beside the rows (``core.counting.budget``'s inputs):
    ``window_of(model)`` gives a model's window and its output reserve when the window comes
    from the model map (None: unknown model), and the settings that the budget reads."""

    window_of: Callable[[str], tuple[int, int] | None]
    safety_margin: float
    default_fixed_tokens: int
    priming_tokens: int = 3
    now: datetime | None = None  # the clock the calibration's age weight reads (default: now)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One compaction-log row as the conversation page shows it."""

    id: int
    created_at: datetime | None
    last_seen_at: datetime | None
    repeats: int
    trigger: str
    action: str
    reason: str
    tokens_before: int
    tokens_after: int
    duration_ms: int
    model: str | None
    error: str | None
    summary_id: int | None
    leaf_message_id: int | None
    task_id: str | None


@dataclass(frozen=True, slots=True)
class Reading:
    """A provider's usage report of one request."""

    leaf_message_id: int | None
    prompt_tokens: int
    estimated_tokens: int
    created_at: datetime | None
