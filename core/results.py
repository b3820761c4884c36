"""What the host API returns: typed, frozen results that the CLI prints and hosts use alike.

Each result is a dataclass with attributes a type checker knows (``stats.pressure``), and it also
reads as a mapping (``stats["pressure"]``, ``dict(stats)``), so code written against the earlier
dict results keeps working. ``as_dict()`` is the JSON object the CLI prints for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from recap.core.values.actions import Action


class _Readable(Mapping[str, Any]):
    """Mapping access over a dataclass's own fields (read-only)."""

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self}

    def __getitem__(self, key: str) -> Any:
        if key in self._names():
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __eq__(self, other: object) -> bool:  # equal to the same result, or to its dict
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking values (lists) inside

    def _names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self))  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False, kw_only=True)
class Stats(_Readable):
    """Context pressure as the compression decision sees it (``recap stats``)."""

    window: int
    used: int  # the whole request in provider tokens (measured, or estimated x calibration)
    basis: str  # "measured" or "estimated"
    pressure: float  # history over the room the budget leaves it
    suggest_compress: bool
    estimated: int
    calibration: float
    fixed: int  # the fixed parts the host last sent (system, tools, ...), or the default
    history: int
    output_reserve: int
    available: int
    trigger: int
    decision: str
    reason: str
    summary_tokens: int = 0  # the summary in use on this branch (0: none yet)
    summary_cap: int = 0  # the most any summary may take (RECAP_SUMMARY_MAX_OUTPUT_TOKENS)
    # The newest summary is ready but not in use yet: requests are built with the one before
    # it until using it pays (``core.decision.activation``); ``summary_tokens`` is its size.
    summary_waiting: bool = False
    # The conversation's recorded provider readings (``record_usage``) added up: the input
    # tokens, the part read from the provider's cache and the part written to it;
    # ``cache_hit_rate`` is cached over input (None until a reading with input is recorded).
    recorded_input_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cache_hit_rate: float | None = None
    # The summary model's input over the conversation's logged runs (the compaction log, pruned
    # on its schedule) and the part read from the provider's cache: the summarizer's request on
    # the chat's prefix (``core.compression.prefix``); the share is None until a run has input.
    summarizer_input_tokens: int = 0
    summarizer_cached_tokens: int = 0
    summarizer_cache_share: float | None = None


@dataclass(frozen=True, eq=False)
class UsageRecorded(_Readable):
    """A provider's usage reading beside Recap's estimate of the same request (``recap usage``)."""

    estimated: int
    measured: int
    calibration: float


@dataclass(frozen=True, eq=False, kw_only=True)
class CompressResult(_Readable):
    """What one compression run did: the one result type from the run (``core.compression.run``)
    to the task's result, ``recap compress --json`` and ``Recap.compress``.

    As a mapping (and ``as_dict()``) it is the contract's six fields; the rest (the summary
    model's usage and cost, the error, the leaf, the calibration) are attributes the compaction
    log records."""

    action: Action
    reason: str
    tokens_before: int
    tokens_after: int
    summary_id: int | None = None
    cutoff_message_id: int | None = None
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    error: str | None = None
    leaf_message_id: int | None = None
    calibration: float = 1.0  # provider tokens per estimated token: tokens_* are provider tokens
    cached_input_tokens: int = 0  # the part of ``input_tokens`` read from the provider's cache

    def _names(self) -> tuple[str, ...]:
        return PUBLIC_COMPRESS_FIELDS

    @classmethod
    def of(cls, payload: Mapping[str, Any]) -> CompressResult:
        """The result from its JSON object (a task's stored result, ``recap compress --json``)."""
        return cls(
            action=Action(str(payload["action"])),
            reason=str(payload.get("reason", "")),
            summary_id=payload.get("summary_id"),
            cutoff_message_id=payload.get("cutoff_message_id"),
            tokens_before=int(payload.get("tokens_before", 0)),
            tokens_after=int(payload.get("tokens_after", 0)),
        )


PUBLIC_COMPRESS_FIELDS = (
    "action",
    "reason",
    "summary_id",
    "cutoff_message_id",
    "tokens_before",
    "tokens_after",
)


@dataclass(frozen=True, eq=False, kw_only=True)
class SummaryInfo(_Readable):
    """One stored summary, as ``recap summaries`` lists it."""

    id: int
    cutoff_message_id: int
    previous_summary_id: int | None
    tokens: int
    model: str | None
    identifier_retention: float
    created_at: str
    # the provider's compaction of the same span, in words ("" without one: the readable
    # summary alone; ``core.compression.provider``)
    provider_compaction: str = ""


@dataclass(frozen=True, eq=False)
class ExportedConversation(Mapping[str, Any]):
    """A branch as stored, in the import format (``recap export``): ``id``, the conversation's
    own metadata keys, and ``messages`` (each with its ``id``)."""

    id: str
    messages: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, **self.meta, "messages": self.messages}

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False, kw_only=True)
class PinResult(_Readable):
    """A message's pin after ``Recap.pin`` / ``unpin`` (``recap pin``)."""

    conversation_id: str
    message_id: int
    pinned: bool  # pinned now
    changed: bool  # this call pinned or unpinned it (False: it already was so)
    pinned_tokens: int  # stored tokens of every pinned message of the conversation now
    max_pinned_tokens: int  # RECAP_MAX_PINNED_TOKENS
