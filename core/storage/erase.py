"""Erasure and retention: a conversation and everything derived from it, rows and files.

``delete_conversation`` removes, in one transaction under the conversation's lock, every row that
names the conversation (messages, summaries, clearings, pins, the compaction log, usage, the
request profile, and the conversation row with its lease), then the files Recap saved for it under
the output folder: full tool outputs, trimmed call arguments and stored media. Files are named by
their content's hash, so one file can serve several conversations: a file still named by a message
of another conversation stays, and so does a file whose time moved since the delete began
(another conversation's ingest just used it). A compression run working on the conversation
finds it gone when it writes and writes nothing (``lock_conversation``).

``expire_idle`` is the retention policy (``RECAP_CONVERSATION_RETENTION_DAYS``): conversations
whose last activity is older than the cutoff, a bounded batch at a time, each deleted on its own
and only if it is still idle under its lock.

``list_conversations`` pages through conversations in SQL (keyset on the id), with each page's
message counts and stored tokens from one grouped query.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Table, Text, cast, delete, func, select
from sqlmodel import SQLModel

from recap.core.counting import media
from recap.core.errors import NotFoundError
from recap.core.storage import attachments, store
from recap.core.storage.db import session_scope
from recap.core.storage.models import CONVERSATIONS, MESSAGES
from recap.core.storage.outputs import saved_name, saved_path

CHUNK = 500  # file names checked per query: well under any bound-parameter limit
MEDIA_NAME_RE = re.compile(re.escape(media.REF_SCHEME) + r"([0-9a-f]{32})")
_c, _m = CONVERSATIONS.c, MESSAGES.c


@dataclass(kw_only=True)
class Deleted:
    """What one delete removed."""

    conversation_id: str
    rows: dict[str, int] = field(default_factory=dict)  # rows removed, by table
    files: int = 0  # saved files removed
    bytes: int = 0
    kept_shared: int = 0  # files of the conversation still used by another one

    def as_dict(self) -> dict[str, Any]:
        """The object ``recap delete --json`` prints."""
        return {
            "deleted": self.conversation_id,
            "messages": self.rows.get(MESSAGES.name, 0),
            "rows": dict(self.rows),
            "files": self.files,
            "bytes": self.bytes,
            "kept_shared_files": self.kept_shared,
        }


def conversation_tables() -> list[Table]:
    """Every table of the schema whose rows belong to one conversation (a ``conversation_id``
    column), children before parents; the conversations table itself is not among them."""
    return [
        table
        for table in reversed(SQLModel.metadata.sorted_tables)
        if "conversation_id" in table.c and table.name != CONVERSATIONS.name
    ]


def delete_conversation(
    engine: Engine,
    conversation_id: str,
    root: Path,
    *,
    idle_before: datetime | None = None,
) -> Deleted | None:
    """Delete the conversation's rows, then its own saved files under ``root``.

    Raises ``NotFoundError`` for an unknown conversation. With ``idle_before`` (the retention
    policy) a conversation active since then is left as it is and None is returned."""
    started = time.time()
    with session_scope(engine) as session:
        if not store.lock_conversation(session, conversation_id, exclusive=True):
            raise NotFoundError(f"unknown conversation {conversation_id!r}")
        connection = session.connection()
        if idle_before is not None:
            last = connection.execute(
                select(_c.last_activity_at).where(_c.id == conversation_id)
            ).scalar()
            if last is not None and store.as_utc(last) >= idle_before:  # type: ignore[operator]
                return None
        names = _own_files(connection, conversation_id, root)
        done = Deleted(conversation_id=conversation_id)
        # summaries elsewhere that may quote it (core.storage.attachments.forget_source)
        forgotten = attachments.forget_source(connection, conversation_id)
        if forgotten:
            done.rows["attaching_summaries"] = forgotten
        for table in conversation_tables():
            statement = delete(table).where(table.c.conversation_id == conversation_id)
            done.rows[table.name] = int(connection.execute(statement).rowcount or 0)
        connection.execute(delete(CONVERSATIONS).where(_c.id == conversation_id))
        done.rows[CONVERSATIONS.name] = 1
    shared = shared_files(engine, names, root)
    done.kept_shared = len(shared)
    for name in sorted(names - shared):
        size = remove_file(saved_path(root, name), before=started)
        if size is not None:
            done.files += 1
            done.bytes += size
    return done


def _own_files(connection: Any, conversation_id: str, root: Path) -> set[str]:
    """The content names of the files the conversation's messages name under ``root``: saved
    outputs and trimmed arguments (``output_path``), and stored media (``recap-media:`` parts)."""
    names: set[str] = set()
    paths = select(_m.output_path).where(
        _m.conversation_id == conversation_id, _m.output_path.is_not(None)
    )
    for (path,) in connection.execute(paths):
        name = saved_name(path, root)
        if name is not None:
            names.add(name)
    parts = select(cast(_m.content_parts, Text)).where(
        _m.conversation_id == conversation_id, _m.content_parts.is_not(None)
    )
    for (value,) in connection.execute(parts):
        names.update(MEDIA_NAME_RE.findall(str(value or "")))
    return names


def shared_files(engine: Engine, names: Iterable[str], root: Path) -> set[str]:
    """Those of ``names`` that a stored message still names (as its saved output, or as a media
    part): files another conversation shares. One read of the saved outputs by path per chunk
    of names, and one of the messages that hold stored media at all (a JSON column holds the
    text ``null`` on most rows, so the media test is on the text)."""
    wanted = sorted(names)
    shared: set[str] = set()
    if not wanted:
        return shared
    parts_text = cast(_m.content_parts, Text)
    with session_scope(engine) as session:
        connection = session.connection()
        for start in range(0, len(wanted), CHUNK):
            chunk = wanted[start : start + CHUNK]
            by_path = {str(saved_path(root, name)): name for name in chunk}
            found = select(_m.output_path).where(_m.output_path.in_(list(by_path))).distinct()
            shared.update(by_path[row[0]] for row in connection.execute(found))
        if len(shared) < len(wanted):
            stored_media = select(parts_text).where(parts_text.like(f"%{media.REF_SCHEME}%"))
            for (value,) in connection.execute(stored_media):
                shared.update(MEDIA_NAME_RE.findall(str(value or "")))
    return shared & set(wanted)


def remove_file(path: Path, *, before: float) -> int | None:
    """Delete the regular file at ``path`` (never a link) unless it was written or used at or
    after ``before`` (a Unix time); its size, or None when nothing was deleted. Its folder goes
    too once empty."""
    try:
        info = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode) or info.st_mtime >= before:
            return None
        path.unlink()
    except FileNotFoundError:
        return None
    with contextlib.suppress(OSError):  # not empty (other files), or already gone
        path.parent.rmdir()
    return info.st_size


def conversation_exists(engine: Engine, conversation_id: str) -> bool:
    """Whether the conversation is stored (one short read)."""
    with session_scope(engine) as session:
        statement = select(_c.id).where(_c.id == conversation_id)
        return session.connection().execute(statement).first() is not None


# --- retention ---------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Expired:
    """What one retention batch deleted."""

    conversations: list[str] = field(default_factory=list)
    messages: int = 0
    files: int = 0
    bytes: int = 0
    more: bool = False  # more idle conversations are left for the next batch

    def as_dict(self) -> dict[str, Any]:
        return {
            "deleted": len(self.conversations),
            "messages": self.messages,
            "files": self.files,
            "bytes": self.bytes,
            "more": self.more,
        }


def idle_ids(engine: Engine, idle_before: datetime, limit: int) -> list[str]:
    """Up to ``limit`` conversations whose last activity is before ``idle_before``, the longest
    idle first (the index on ``last_activity_at``)."""
    statement = (
        select(_c.id)
        .where(_c.last_activity_at < idle_before)
        .order_by(_c.last_activity_at, _c.id)
        .limit(limit)
    )
    with session_scope(engine) as session:
        return [str(row[0]) for row in session.connection().execute(statement)]


def expire_idle(engine: Engine, root: Path, *, idle_before: datetime, limit: int) -> Expired:
    """Delete up to ``limit`` conversations idle since before ``idle_before``, each in its own
    transaction and only if still idle under its lock; ``more`` when the batch was full."""
    result = Expired()
    ids = idle_ids(engine, idle_before, limit + 1)
    result.more = len(ids) > limit
    for conversation_id in ids[:limit]:
        try:
            done = delete_conversation(engine, conversation_id, root, idle_before=idle_before)
        except NotFoundError:  # deleted meanwhile by someone else
            continue
        if done is None:
            continue
        result.conversations.append(conversation_id)
        result.messages += done.rows.get(MESSAGES.name, 0)
        result.files += done.files
        result.bytes += done.bytes
    return result


# --- listing -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationRow:
    """One conversation of a listing page."""

    id: str
    model: str
    messages: int
    tokens: int
    created_at: datetime | None
    last_activity_at: datetime | None


def list_conversations(
    engine: Engine,
    *,
    after: str | None = None,
    limit: int = 50,
    idle_before: datetime | None = None,
) -> tuple[list[ConversationRow], str | None]:
    """One page of conversations in id order after ``after`` (only those idle since before
    ``idle_before`` when given), with their message counts and stored tokens; and the cursor of
    the next page (None on the last). Reads ``limit + 1`` conversation rows and one grouped
    aggregate of the page's messages: never the whole table."""
    statement = select(_c.id, _c.model, _c.created_at, _c.last_activity_at)
    if after is not None:
        statement = statement.where(_c.id > after)
    if idle_before is not None:
        statement = statement.where(_c.last_activity_at < idle_before)
    statement = statement.order_by(_c.id).limit(limit + 1)
    with session_scope(engine) as session:
        connection = session.connection()
        heads = list(connection.execute(statement))
        page = heads[:limit]
        ids = [str(row[0]) for row in page]
        totals: dict[str, tuple[int, int]] = {}
        if ids:
            grouped = (
                select(_m.conversation_id, func.count(_m.id), func.coalesce(func.sum(_m.tokens), 0))
                .where(_m.conversation_id.in_(ids))
                .group_by(_m.conversation_id)
            )
            totals = {str(r[0]): (int(r[1]), int(r[2])) for r in connection.execute(grouped)}
    rows = [
        ConversationRow(
            id=str(row[0]),
            model=str(row[1]),
            messages=totals.get(str(row[0]), (0, 0))[0],
            tokens=totals.get(str(row[0]), (0, 0))[1],
            created_at=store.as_utc(row[2]),
            last_activity_at=store.as_utc(row[3]),
        )
        for row in page
    ]
    following = ids[-1] if len(heads) > limit and ids else None
    return rows, following
