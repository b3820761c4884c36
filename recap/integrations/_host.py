"""What every adapter does with the host API: make the conversation, assemble (compressing now
when the request cannot fit), record, and enqueue compression after a turn.

Everything here is blocking (database work, a broker send); the async adapters run it on
``AsyncRecap``'s thread pool.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError

from recap.core.client import Recap
from recap.core.errors import BudgetError, InputError, NotFoundError
from recap.core.request.assembly import AssembledRequest
from recap.core.values.records import SYSTEM_ROLES

log = logging.getLogger("recap.integrations")
# assemble's refusal of a branch with nothing to send: an empty session, for an adapter
EMPTY_BRANCH = "nothing to send"


def exists(recap: Recap, conversation_id: str) -> bool:
    """Whether the conversation is stored (one primary-key read)."""
    try:
        recap.summaries(conversation_id)
    except NotFoundError:
        return False
    return True


def ensure_conversation(
    recap: Recap,
    conversation_id: str,
    *,
    model: str | None = None,
    max_input_tokens: int | None = None,
) -> None:
    """Create the conversation unless it is stored already (a stored one keeps its model and
    window). Safe from many threads or processes at once: one creates it, the others find it."""
    if exists(recap, conversation_id):
        return
    try:
        recap.new(conversation_id, model=model, max_input_tokens=max_input_tokens)
    except (InputError, IntegrityError):  # a creation race surfaces as either, by database
        if not exists(recap, conversation_id):  # not a creation race: a bad id
            raise


@dataclass(frozen=True)
class Assembled:
    """Recap's request for a branch: its history (the system prompt taken off), and the rest
    (None for an empty branch)."""

    history: list[dict[str, Any]]
    request: AssembledRequest | None


def assemble(
    recap: Recap,
    conversation_id: str,
    *,
    leaf: int | None = None,
    system: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    user_id: str | None = None,
) -> Assembled:
    """Recap's assembly of the branch ending at ``leaf`` (default: the head). ``system`` and
    ``tools`` are what the framework sends beside the history: counted as the request's fixed
    parts, and the system message taken off again (the framework sends its own). A request
    that cannot fit is compressed now, in this process, and assembled once more (the README's
    host loop). ``user_id`` sends that user's memory with it (docs/memory.md)."""
    parts: dict[str, Any] = {"system": system, "tools": tools, "user_id": user_id}
    try:
        try:
            request = recap.assemble(conversation_id, leaf=leaf, **parts)
        except BudgetError:
            recap.compress(conversation_id, leaf=leaf)
            request = recap.assemble(conversation_id, leaf=leaf, **parts)
    except InputError as exc:
        if str(exc).startswith(EMPTY_BRANCH):
            return Assembled([], None)
        raise
    messages = list(request.messages)
    if system is not None and messages and messages[0].get("role") in SYSTEM_ROLES:
        messages = messages[1:]
    return Assembled(messages, request)


def add_messages(
    recap: Recap,
    conversation_id: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    parent_id: int | None = None,
) -> list[int]:
    """Append one batch (all or nothing); no ids for an empty one."""
    if not messages:
        return []
    return recap.add_many(conversation_id, list(messages), parent_id=parent_id)


def enqueue(
    recap: Recap, conversation_id: str, leaf: int | None = None, user_id: str | None = None
) -> str | None:
    """``compress_later`` on the broker of ``recap``'s settings (and the user's memory
    extraction, with ``user_id``); the task id. A broker that cannot be reached is logged and
    the turn goes on (``recap reconcile`` catches up)."""
    from recap.workers.enqueue import compress_later

    try:
        return compress_later(
            conversation_id, leaf, broker_url=recap.settings.broker_url, user_id=user_id
        )
    except Exception as exc:  # the turn must not fail on the broker: reconcile re-enqueues
        log.warning("compress_later failed for %s: %s", conversation_id, exc)
        return None
