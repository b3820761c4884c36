"""Stored token counts follow the conversation's model: recounted when its tokenizer changes.

Every message row stores its ``tokens`` and what they were counted with in ``encoding``: the
tiktoken encoding, followed by the reasoning family for rows that carry reasoning (a family decides
whether that reasoning is in the count: ``core.counting.reasoning``). A row is current for a model
when its ``encoding`` is one of ``core.counting.reasoning.bases_for`` that model's encoding and
family.

When a conversation moves to a model with another basis (``set_model``; o200k ``gpt-4o`` to
cl100k ``gpt-4``, or an OpenAI model to a Claude one for rows with thinking), its rows are
recounted:

- lazily on the request path: the request read gives each row's basis (``core.storage.reads``), and
  ``assemble`` recounts the stale rows it read, for this request, and writes their new counts back
  in one short transaction, so no row is recounted there twice;
- in batches off the request path: ``recount_conversation`` walks the conversation by id in
  short transactions of ``RECOUNT_BATCH`` rows (``recap recount``, and the ``recap.recount_tokens``
  task that ``set_model`` callers enqueue).

A recount also moves the ``tokens_reclaimed`` of the row's clearings by the same difference (a
cleared result keeps costing its placeholder), and recounts a ``reasoning`` clearing anew.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, select, update
from sqlmodel import Session

from recap.core.counting import reasoning, tokens
from recap.core.errors import NotFoundError
from recap.core.request.assembly import REASONING_CLEARING
from recap.core.storage import store
from recap.core.storage.db import session_scope
from recap.core.storage.models import CLEARINGS, CONVERSATIONS, MESSAGES
from recap.core.storage.reads import RequestBranch
from recap.core.values.records import ARGUMENTS, CLEARED, Msg

RECOUNT_BATCH = 500  # rows per transaction: a few ms of counting, a short write lock on SQLite


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One row's new count, and what it was counted with."""

    message_id: int
    tokens: int
    basis: str
    delta: int  # new tokens minus the stored ones
    reasoning: int  # tokens of the reasoning in the new count


@dataclass(frozen=True, slots=True)
class Recount:
    """What a recount did: rows looked at and recounted, where it stopped, whether more is left."""

    examined: int
    recounted: int
    last_message_id: int
    more: bool

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``recap recount --json`` and the task."""
        return {
            "examined": self.examined,
            "recounted": self.recounted,
            "last_message_id": self.last_message_id,
            "more": self.more,
        }


def current_bases(model: str) -> tuple[str, str]:
    """The ``encoding`` values of rows counted as ``model`` counts them."""
    return reasoning.bases_for(tokens.encoding_name_for(model), reasoning.family_of(model))


def change_for(message: Msg, basis: str, model: str) -> Change | None:
    """The new count of a stored message for ``model``, or None when its count is current."""
    if basis in current_bases(model):
        return None
    encoding = tokens.encoding_name_for(model)
    raw = message.to_openai()
    count = tokens.count_message(raw, encoding, model=model)
    return Change(
        message_id=message.id,
        tokens=count,
        basis=tokens.count_basis(raw, encoding, model=model),
        delta=count - message.tokens,
        reasoning=tokens.count_reasoning(raw, encoding, model=model),
    )


def apply(branch: Sequence[Msg], changes: Iterable[Change]) -> list[Msg]:
    """The branch with the changed messages at their new counts (pure)."""
    by_id = {change.message_id: change for change in changes}
    if not by_id:
        return list(branch)
    return [m._replace(tokens=by_id[m.id].tokens) if m.id in by_id else m for m in branch]


def changes_for(branch: Sequence[Msg], stale: dict[int, str], model: str) -> list[Change]:
    """The new counts of the stale messages of ``branch``."""
    found = (change_for(m, stale[m.id], model) for m in branch if m.id in stale)
    return [change for change in found if change is not None]


_SET_COUNT = (
    update(MESSAGES)
    .where(MESSAGES.c.id == bindparam("row_id"))
    .values(tokens=bindparam("new_tokens"), encoding=bindparam("basis"))
)
_CLEARINGS_OF = select(
    CLEARINGS.c.message_id,
    CLEARINGS.c.reason,
    CLEARINGS.c.tokens_reclaimed,
    CLEARINGS.c.stage,
    CLEARINGS.c.conversation_id,
).where(CLEARINGS.c.message_id.in_(bindparam("ids", expanding=True)))
_SET_RECLAIMED = (  # by the clearings' unique key: one index probe a row, not a table scan
    update(CLEARINGS)
    .where(
        CLEARINGS.c.conversation_id == bindparam("cleared_conversation"),
        CLEARINGS.c.message_id == bindparam("cleared_id"),
        CLEARINGS.c.stage == bindparam("cleared_stage"),
    )
    .values(tokens_reclaimed=bindparam("reclaimed"))
)


def write(connection: Connection, changes: Sequence[Change]) -> None:
    """Store the new counts and their basis, and move the rows' clearings with them."""
    if not changes:
        return
    connection.execute(
        _SET_COUNT,
        [{"row_id": c.message_id, "new_tokens": c.tokens, "basis": c.basis} for c in changes],
    )
    by_id = {c.message_id: c for c in changes}
    cleared = connection.execute(_CLEARINGS_OF, {"ids": list(by_id)}).all()
    if cleared:
        connection.execute(
            _SET_RECLAIMED,
            [
                {
                    "cleared_conversation": cid,
                    "cleared_id": mid,
                    "cleared_stage": stage,
                    "reclaimed": _reclaimed(by_id[mid], reason, int(old), stage),
                }
                for mid, reason, old, stage, cid in cleared
            ],
        )


def _reclaimed(change: Change, reason: str, old: int, stage: str) -> int:
    """A clearing's saving after its row's recount: a dropped reasoning is its new count,
    shortened arguments save what they saved (the least of either encoding already), any other
    step keeps the message at the same placeholder or aged cost."""
    if reason == REASONING_CLEARING and stage == CLEARED:
        return change.reasoning
    if stage == ARGUMENTS:
        return old
    return max(old + change.delta, 0)


def recount_batch(
    engine: Engine, conversation_id: str, model: str, *, after_id: int, batch: int
) -> Recount:
    """Recount one batch of the conversation's rows after ``after_id``, in one transaction."""
    columns = (*store.MESSAGE_COLUMNS, MESSAGES.c.encoding)
    statement = (
        select(*columns)
        .where(MESSAGES.c.conversation_id == conversation_id, MESSAGES.c.id > after_id)
        .order_by(MESSAGES.c.id)
        .limit(batch)
    )
    with session_scope(engine) as session:
        rows = session.connection().execute(statement).all()
        changes = [
            change
            for change in (change_for(store.to_msg(row), str(row[-1]), model) for row in rows)
            if change is not None
        ]
        write(session.connection(), changes)
    last = int(rows[-1][0]) if rows else after_id
    return Recount(len(rows), len(changes), last, len(rows) == batch)


def conversation_model(session: Session, conversation_id: str) -> str:
    """The conversation's model, or a ``NotFoundError``."""
    model = (
        session.connection()
        .execute(select(CONVERSATIONS.c.model).where(CONVERSATIONS.c.id == conversation_id))
        .scalar()
    )
    if model is None:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    return str(model)


def recount_conversation(
    engine: Engine,
    conversation_id: str,
    *,
    batch: int = RECOUNT_BATCH,
    after_id: int = 0,
    max_batches: int | None = None,
) -> Recount:
    """Recount the conversation's stale rows for its model, batch by batch (each its own short
    transaction); stops after ``max_batches`` with ``more`` set when rows are left."""
    with session_scope(engine) as session:
        model = conversation_model(session, conversation_id)
    examined = recounted = done = 0
    last, more = after_id, True
    while more and (max_batches is None or done < max_batches):
        step = recount_batch(engine, conversation_id, model, after_id=last, batch=batch)
        examined += step.examined
        recounted += step.recounted
        last, more, done = step.last_message_id, step.more, done + 1
    return Recount(examined, recounted, last, more)


def set_model(
    engine: Engine, conversation_id: str, model: str, *, max_input_tokens: int | None = None
) -> bool:
    """Record that the conversation now uses ``model`` (and its window override); whether its
    stored counts need a recount (the model counts with another basis). The recount itself is
    lazy: the request path recounts what it reads, ``recount_conversation`` the rest."""
    tokens.context_window(model, max_input_tokens)  # an unknown model fails before any write
    with session_scope(engine) as session:
        old = conversation_model(session, conversation_id)
        session.connection().execute(
            update(CONVERSATIONS)
            .where(CONVERSATIONS.c.id == conversation_id)
            .values(model=model, max_input_tokens=max_input_tokens)
        )
    return current_bases(old) != current_bases(model)


def refreshed(loaded: RequestBranch, model: str) -> tuple[RequestBranch, list[Change]]:
    """The request's rows at current counts for ``model``, and the changes made (request path:
    the read gave each row's basis; counting only for rows that are stale)."""
    current = current_bases(model)
    stale = {mid: basis for mid, basis in loaded.bases.items() if basis not in current}
    if not stale:
        return loaded, []
    changes = changes_for(loaded.branch, stale, model)
    return replace(loaded, branch=apply(loaded.branch, changes)), changes


def record(
    engine: Engine,
    conversation_id: str,
    changes: Sequence[Change],
    dropped: Sequence[tuple[int, int]],
    *,
    incarnation: str | None = None,
) -> None:
    """Write back what a request learned, in one short transaction (nothing when it learned
    nothing): rows recounted for the conversation's model, and older messages whose thinking is
    no longer sent (``reasoning`` clearings). Nothing is written when the conversation is no
    longer the ``incarnation`` the request read (deleted, perhaps created again)."""
    if not changes and not dropped:
        return
    from recap.core.storage.store import lock_conversation
    from recap.core.storage.sweep import apply_clearings
    from recap.core.values.clearing import ClearingPlan, PlannedClearing

    with session_scope(engine) as session:
        if not lock_conversation(session, conversation_id, incarnation=incarnation):
            return
        write(session.connection(), changes)
        items = tuple(
            PlannedClearing(message_id=mid, tokens_reclaimed=saved) for mid, saved in dropped
        )
        apply_clearings(session, conversation_id, ClearingPlan(REASONING_CLEARING, items))
