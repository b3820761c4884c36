"""What ``recap serve``'s writes and reads of the store hand back, as plain values: who may use a
conversation and what a new one is created with (``Owner``), where a client key's conversation
name is stored (``Resolved``), where a request's history landed (``Mapped``), and a stored reply
as a response id reads it back (``StoredReply``). Written and read by ``core.storage.requests``
and ``core.storage.responses``, used by ``workers.serve``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Mapped:
    """Where a request's history landed: the leaf of its branch, how many of its messages were
    stored already, and the ids of those appended now."""

    leaf_id: int | None
    matched: int
    appended: list[int]
    path: tuple[int, ...] = ()  # the stored id of every message of the request


@dataclass(frozen=True, slots=True)
class Owner:
    """Who may use a conversation, and what a new one is created with."""

    fingerprint: str
    model: str
    max_input_tokens: int | None


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where a client key's conversation ``name`` is stored: ``conversation_id``, and whether
    that conversation exists already (else it is the id a first turn creates)."""

    conversation_id: str
    exists: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredReply:
    """A stored reply as ``GET /v1/responses/{id}`` reads it back: the message (OpenAI chat
    format), when it was stored, the conversation's model, and the provider's usage of the
    request it answered (prompt, completion, cached tokens), when recorded."""

    id: int
    message: dict[str, Any]
    created_at: datetime
    model: str
    usage: tuple[int, int, int] | None
