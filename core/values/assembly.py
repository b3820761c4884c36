"""The request view's values at its two ends: what ``core.request.assembly.assemble`` takes of
the store (``StoredBranch``) and what it returns (``AssembledRequest`` with its
``TokenBreakdown``). Each is frozen, and built by keyword."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from recap.core.values.attach import Block
from recap.core.values.memory import MemoryRec
from recap.core.values.records import ClearingRec, Msg, SummaryRec


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredBranch:
    """What the store holds for one branch (copied out by ``core.storage.reads``): the messages
    root first, the summary that applies, the clearings, the pinned messages (root first), the
    ids of the oldest messages the caller left unread because no request can hold them
    (``omittable``) and the saved output files that no longer exist."""

    branch: Sequence[Msg]
    summary: SummaryRec | None = None
    clearings: Mapping[int, ClearingRec] | None = None
    pinned: Sequence[Msg] = ()
    omitted: Sequence[int] = ()
    missing_outputs: Collection[str] = frozenset()
    # the user's memory entries to send (``core.request.memory.chosen``: within the cap)
    memories: Sequence[MemoryRec] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenBreakdown:
    """Tokens of each part of a request; ``total`` adds the reply priming to their sum."""

    system: int
    summary: int
    history: int
    context: int
    tools: int
    reminder: int
    total: int
    media: int = 0  # images, audio and files sent in full (not in ``history``)
    reasoning: int = 0  # reasoning and thinking content sent (not in ``history``)
    memory: int = 0  # the user's memory message (a fixed part, see ``core.request.memory``)

    def as_dict(self) -> dict[str, int]:
        """The breakdown as the CLI prints it."""
        return {
            "system": self.system,
            "summary": self.summary,
            "history": self.history,
            "context": self.context,
            "tools": self.tools,
            "reminder": self.reminder,
            "media": self.media,
            "reasoning": self.reasoning,
            "memory": self.memory,
            "total": self.total,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class AssembledRequest:
    """The request to send now, and what was left out of it."""

    messages: list[dict[str, Any]]
    tokens: TokenBreakdown
    budget: int
    window: int
    summary_id: int | None
    dropped_message_ids: list[int]
    forgotten_files: list[str]
    # Messages whose media all aged in this request: (id, tokens reclaimed), to record as
    # ``media`` clearings so they stay aged (one-way).
    media_aged: tuple[tuple[int, int], ...] = ()
    truncated: bool = False  # older history was left out to fit the budget (never silently)
    truncated_tokens: int = 0  # stored tokens of the older messages left out (as far as read)
    # Older assistant messages whose thinking this request no longer sends: (id, tokens), to
    # record as ``reasoning`` clearings so that decisions without content plan without them.
    reasoning_dropped: tuple[tuple[int, int], ...] = ()
    # Tool results of the newest step sent as their head and tail because they could not fit
    # whole: (id, tokens reclaimed), to record as ``shortened`` clearings (one-way, same bytes).
    shortened: tuple[tuple[int, int], ...] = ()
    # The tail did not fit whole (results shortened or steps left out): a caller that left
    # rows unread on the assumption that it does (``omittable``) reads the whole branch again.
    fitted_tail: bool = False
    # The room the reply may take (the window less the request in provider tokens, capped by
    # the model's maximum output); set by ``core.service.assemble``, which knows the calibration.
    max_output_tokens: int | None = None
    # OpenAI's caching hints for this request, set by ``core.service.assemble``:
    # ``prompt_cache_key`` is the same for every request of one conversation's branch (a digest,
    # never the conversation id itself), ``prompt_cache_retention`` is
    # RECAP_PROMPT_CACHE_RETENTION (None: the provider's default). ``cache_params()`` gives both
    # as the OpenAI client's keyword arguments.
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    # Attachments expanded into this request (``core.request.attach``), set by
    # ``core.service.assemble``: each block, and each attached item's provenance (message id ->
    # ``conversation:message``).
    attachments: tuple[Block, ...] = ()
    provenance: Mapping[int, str] = field(default_factory=dict)

    def cache_params(self) -> dict[str, str]:
        """The caching hints as keyword arguments of an OpenAI request (those that are set)."""
        params = {"prompt_cache_key": self.prompt_cache_key}
        params["prompt_cache_retention"] = self.prompt_cache_retention
        return {name: value for name, value in params.items() if value is not None}

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``recap assemble --json``."""
        return (
            {
                "messages": self.messages,
                "tokens": self.tokens.as_dict(),
                "budget": self.budget,
                "window": self.window,
                "summary_id": self.summary_id,
                "dropped_message_ids": self.dropped_message_ids,
                "forgotten_files": self.forgotten_files,
                "truncated": self.truncated,
            }
            | (
                {}
                if self.max_output_tokens is None
                else {"max_output_tokens": self.max_output_tokens}
            )
            | ({"attachments": [_block(b) for b in self.attachments]} if self.attachments else {})
        )


def _block(block: Block) -> dict[str, Any]:
    """An expanded attachment as ``recap assemble --json`` prints it."""
    return {
        "source": block.source,
        "leaf": block.leaf,
        "open": block.open_id,
        "close": block.close_id,
        "items": list(block.items),
        "fallback": block.fallback,
    }


CacheRetention = Literal["in_memory", "24h"]
CACHE_KEY_PREFIX = "recap-"


def prompt_cache_key(conversation_id: str, root_id: int | None) -> str:
    """The ``prompt_cache_key`` of a conversation's branch: a digest of the conversation's
    stored id and the branch's first message (``core.storage.reads.Tree.branch_root``), so
    each branch's requests keep one cache while no two conversations (or tenants) share one,
    and the id itself is never sent."""
    digest = hashlib.sha256(f"{conversation_id}\x00{root_id}".encode()).hexdigest()
    return CACHE_KEY_PREFIX + digest[:32]
