"""Writing summaries, and the write transaction that ends a compression run.

A summary is inserted at most once per (conversation, cutoff), whatever the concurrency, retries
or redelivery: the unique key decides, and a run that loses the race learns the winner's id.
``write_run`` is a run's last step, one short transaction under the conversation's lease: the
summary (if any), the clearings the new summary makes free, the run's compaction-log row, and
the lease let go (or kept when the conversation turned dirty meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from recap.core.errors import ConversationGone
from recap.core.storage import attachments, compaction_log, store, sweep
from recap.core.storage.db import session_scope
from recap.core.storage.lease import Lease, release_on
from recap.core.storage.models import SUMMARIES
from recap.core.values.clearing import ClearingPlan

_KEY = ["conversation_id", "cutoff_message_id"]


def insert_summary(connection: Connection, values: Mapping[str, Any]) -> int | None:
    """Insert unless (conversation, cutoff) exists; the new id, or None on a conflict."""
    name = connection.dialect.name
    if name in ("sqlite", "postgresql"):
        dialect_insert = sqlite.insert if name == "sqlite" else postgresql.insert
        statement = (
            dialect_insert(SUMMARIES)
            .values(**values)
            .on_conflict_do_nothing(index_elements=_KEY)
            .returning(SUMMARIES.c.id)
        )
        row = connection.execute(statement).first()
        return int(row[0]) if row is not None else None
    try:
        with connection.begin_nested():
            key = connection.execute(insert(SUMMARIES).values(**values)).inserted_primary_key
            return int(key[0]) if key is not None else None
    except IntegrityError:
        return None


def summary_at(connection: Connection, conversation_id: str, cutoff: int) -> int | None:
    """The id of the conversation's summary up to ``cutoff``, if there is one."""
    c = SUMMARIES.c
    statement = select(c.id).where(
        c.conversation_id == conversation_id, c.cutoff_message_id == cutoff
    )
    value = connection.execute(statement).scalar()
    return int(value) if value is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Written:
    """What a run's write transaction did."""

    summary_id: int | None = None  # the new summary, or on a conflict the one another run wrote
    conflict: bool = False  # another run had already summarized up to the same cutoff
    cleared: int = 0  # steps recorded after the new summary (results aged or cleared, arguments)
    tokens_reclaimed: int = 0
    lease: str = "none"  # lease.release_on's answer, or "none" without a lease
    steps: str = ""  # those steps in words (``sweep.Applied.describe``)
    source_gone: bool = False  # an attached conversation was erased: no summary written


def write_run(  # noqa: PLR0913 - the run's writes, each named
    engine: Engine,
    conversation: store.Identity,
    *,
    summary: Mapping[str, Any] | None,
    sources: Mapping[str, str | None] | None = None,
    clear_after: ClearingPlan | None,
    log_row: Callable[[Written], dict[str, Any]],
    held: Lease | None,
    force_release: bool,
    now: datetime,
) -> Written:
    """A run's writes in one short transaction: ``summary`` (the columns of a new row; a conflict
    means another run wrote it; none when one of ``sources``, the conversations the run's
    snapshot attached, was erased since: ``Written.source_gone``), then, when it is new, the
    ``clear_after`` plan, the log row
    ``log_row`` makes of what was written (``compaction_log.record_run``), and the lease let go
    with ``last_compacted_at`` set (or kept when the conversation turned dirty: see
    ``lease.release_on``; ``force_release`` lets go anyway). Raises ``ConversationGone``,
    having written nothing, when the conversation was deleted meanwhile, or is another
    incarnation than the one the run read (deleted and created again under its id)."""
    conversation_id, incarnation = conversation
    written = Written()
    with session_scope(engine) as session:
        if not store.lock_conversation(session, conversation_id, incarnation=incarnation):
            raise ConversationGone(f"conversation {conversation_id!r} was deleted")
        connection = session.connection()
        if summary is not None and not attachments.sources_unchanged(connection, sources or {}):
            summary, written = None, Written(source_gone=True)
        if summary is not None:
            new_id = insert_summary(connection, summary)
            if new_id is None:
                cutoff = int(summary["cutoff_message_id"])
                existing = summary_at(connection, conversation_id, cutoff)
                written = Written(summary_id=existing, conflict=True)
            else:
                applied = sweep.Applied(0, 0)
                if clear_after:
                    applied = sweep.apply_clearings(session, conversation_id, clear_after, now=now)
                written = Written(
                    summary_id=new_id,
                    conflict=False,
                    cleared=applied.steps,
                    tokens_reclaimed=applied.tokens_reclaimed,
                    steps=applied.describe(),
                )
        compaction_log.record_run(connection, log_row(written))  # a skip after a skip: counted
        if held is None:
            return written
        state = release_on(connection, held, force=force_release, last_compacted_at=now)
    return replace(written, lease=state)
