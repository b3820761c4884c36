"""Attach pointers and merges as stored: written by ``attach`` and ``open_merge``, read back for
each request (``pointers_of``, ``source_loader``), a merge committed when its reply is added
(``commit_merges``).

An attachment is two marker messages appended to the conversation's branch (its open and close
markers, ordinary user messages whose text says what stands there) and one ``attachments`` row:
the source conversation, its incarnation and the leaf its branch ends at when attached. The
source is read again at each assembly (``core.request.attach.expand``), so an erased source is
never sent: its attachment falls back to one item. A source belongs to the same owner as the
conversation it is attached to (the same ``recap serve`` key, or none for the library's): any
other is refused when attaching, and never read when expanding.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, select, update
from sqlmodel import Session

from recap.core.errors import NotFoundError
from recap.core.request.attach import close_text, open_text
from recap.core.request.prefix import chain_ends
from recap.core.storage import store
from recap.core.storage.models import (
    ATTACHMENTS,
    CONVERSATIONS,
    MERGES,
    MESSAGES,
    SUMMARIES,
    utcnow,
)
from recap.core.storage.reads import branch_path, read_tree, stored_json
from recap.core.values.attach import ATTACH, Pointer, Source, SourceLoader

A, C, G, M = ATTACHMENTS.c, CONVERSATIONS.c, MERGES.c, MESSAGES.c
ID_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Found:
    """A source as checked before attaching: its id, incarnation and the leaf to attach."""

    conversation_id: str
    incarnation: str
    leaf: int | None
    tokens: int = 0  # the branch's stored tokens


def check_source(
    connection: Connection, conversation_id: str, source: str, leaf: int | None
) -> Found:
    """The source to attach, checked: it exists and has the conversation's owner (another
    owner's is refused as unknown, never told apart), ``leaf`` is one of its messages (default:
    its latest)."""
    rows = dict(
        (str(r[0]), (r[1], r[2]))
        for r in connection.execute(
            select(C.id, C.owner, C.incarnation).where(C.id.in_([conversation_id, source]))
        )
    )
    if conversation_id not in rows:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    if source not in rows or rows[source][0] != rows[conversation_id][0]:
        raise NotFoundError(f"unknown conversation {source!r}")
    tree = read_tree(connection, source)
    path = tree.path(source, leaf)
    return Found(
        source, str(rows[source][1]), path[-1] if path else None, sum(tree.tokens_along(path))
    )


def open_calls_at(connection: Connection, conversation_id: str, head: int | None) -> bool:
    """Whether ``head`` (default: the latest message) is an assistant message with tool calls
    (the results must come first: markers there would split the pairs)."""
    statement = select(M.role, M.tool_calls).where(M.conversation_id == conversation_id)
    if head is not None:
        statement = statement.where(M.id == head)
    statement = statement.order_by(M.id.desc()).limit(1)
    row = connection.execute(statement).first()
    return row is not None and row[0] == "assistant" and bool(_json_list(row[1]))


def attach(
    session: Session,
    conversation_id: str,
    found: Sequence[Found],
    *,
    kind: str = ATTACH,
    lock_first: bool = False,
    then: Sequence[dict[str, Any]] = (),
    parent_id: int | None = None,
) -> tuple[list[Pointer], list[int]]:
    """Append each source's open and close markers after the head, then the messages ``then``
    (a merge's instruction), with the rows naming the sources, in one transaction under the
    conversation's append lock; the pointers and the ids of ``then``."""
    markers: list[dict[str, Any]] = []
    for source in found:
        markers.append({"role": "user", "content": open_text(source.conversation_id, source.leaf)})
        markers.append({"role": "user", "content": close_text(source.conversation_id)})
    ids = store.append_messages(session, conversation_id, [*markers, *then], parent_id)
    pointers = []
    for i, source in enumerate(found):
        locked = lock_first and i == 0
        pointer = Pointer(
            ids[2 * i],
            ids[2 * i + 1],
            source.conversation_id,
            source.leaf,
            kind,
            locked,
            source.incarnation,
        )
        session.connection().execute(
            ATTACHMENTS.insert().values(
                conversation_id=conversation_id,
                open_message_id=pointer.open_id,
                close_message_id=pointer.close_id,
                source_conversation_id=pointer.source,
                source_incarnation=pointer.incarnation,
                source_leaf_id=pointer.leaf,
                source_tokens=source.tokens,
                kind=kind,
                locked=locked,
                created_at=utcnow(),
            )
        )
        pointers.append(pointer)
    return pointers, ids[len(markers) :]


def set_merge(connection: Connection, open_ids: Sequence[int], merge_id: int) -> None:
    """Name the merge the attachments opened at ``open_ids`` belong to."""
    connection.execute(
        update(ATTACHMENTS).where(A.open_message_id.in_(list(open_ids))).values(merge_id=merge_id)
    )


def tokens_after(connection: Connection, conversation_id: str, cutoff: int) -> int:
    """The stored tokens of the sources attached after ``cutoff`` (any branch's): what the
    attachments add to a history, at most."""
    statement = select(func.coalesce(func.sum(A.source_tokens), 0)).where(
        A.conversation_id == conversation_id, A.close_message_id > cutoff
    )
    return int(connection.execute(statement).scalar() or 0)


def attached_already(
    connection: Connection, conversation_id: str, source: str, leaf: int | None
) -> bool:
    """Whether the conversation attaches ``source`` up to ``leaf`` already."""
    statement = select(A.id).where(
        A.conversation_id == conversation_id,
        A.source_conversation_id == source,
        A.source_leaf_id == leaf,
    )
    return connection.execute(statement.limit(1)).first() is not None


_POINTERS = select(
    A.open_message_id,
    A.close_message_id,
    A.source_conversation_id,
    A.source_leaf_id,
    A.kind,
    A.locked,
    A.source_incarnation,
).where(A.conversation_id == bindparam("cid"))


def pointers_of(connection: Connection, conversation_id: str) -> dict[int, Pointer]:
    """The conversation's attach pointers by open marker id (one indexed read; none for most)."""
    return {
        int(row[0]): Pointer(
            int(row[0]), int(row[1]), str(row[2]), row[3], str(row[4]), bool(row[5]), row[6]
        )
        for row in connection.execute(_POINTERS, {"cid": conversation_id})
    }


_MARKERS = (  # built once: read on every request of the serve path
    select(A.open_message_id, A.close_message_id, M.parent_id)
    .join(MESSAGES, M.id == A.open_message_id)
    .where(A.conversation_id == bindparam("cid"))
)


def marker_bridges(connection: Connection, conversation_id: str) -> dict[int, int]:
    """Each message attachment markers follow -> the last marker of the chain after it
    (``prefix.chain_ends``): a history a client resends maps over them (one indexed read,
    nothing for most conversations)."""
    rows = connection.execute(_MARKERS, {"cid": conversation_id}).all()
    if not rows:
        return {}
    return chain_ends((int(o), int(c), None if p is None else int(p)) for o, c, p in rows)


_LIVE = (
    select(A.source_conversation_id, C.incarnation)
    .join(CONVERSATIONS, C.id == A.source_conversation_id)
    .where(A.conversation_id == bindparam("cid"), A.source_conversation_id != bindparam("cid"))
)


def live_sources(connection: Connection, conversation_id: str) -> dict[str, str | None]:
    """The other conversations ``conversation_id`` attaches that are stored now, with their
    incarnations: what a compression run may quote. Read before the run reads anything else
    (its summary, its branch, a source's items), so that a source erased after this read is
    one ``sources_unchanged`` finds gone."""
    found = connection.execute(_LIVE, {"cid": conversation_id})
    return {str(source): (None if i is None else str(i)) for source, i in found}


def sources_unchanged(connection: Connection, sources: Mapping[str, str | None]) -> bool:
    """Whether each of ``sources`` is still stored as the same incarnation, in a write
    transaction: a summary quoting a source erased during the run is never written. On
    PostgreSQL each source's row is locked ``FOR KEY SHARE`` (in id order): an erasure, which
    locks it ``FOR UPDATE`` before it deletes the summaries quoting it (``forget_source``),
    waits for this transaction and then deletes its summary too; one that got there first has
    committed by the time the lock is granted, and the row is gone."""
    for source in sorted(sources):
        statement = select(C.incarnation).where(C.id == source)
        found = connection.execute(statement.with_for_update(read=True, key_share=True)).first()
        if found is None or (None if found[0] is None else str(found[0])) != sources[source]:
            return False
    return True


_ROW = select(C.owner, C.incarnation).where(C.id == bindparam("cid"))
CACHED_SOURCES = 512  # source branches kept read in this process
_sources: OrderedDict[tuple[str, str, int | None], Source] = OrderedDict()
_sources_lock = threading.Lock()


def source_loader(connection: Connection, conversation_id: str) -> SourceLoader:
    """Reads the source branches of ``conversation_id``'s attachments on ``connection``: a
    source that is gone, created again since it was attached, or another owner's reads None.

    A source branch up to its leaf never changes (the tree is append-only, and an erased
    conversation's id comes back with another incarnation), so each is read once per process
    and kept (``CACHED_SOURCES``); its conversation row is checked at every load."""
    owner = connection.execute(_ROW, {"cid": conversation_id}).first()
    mine = owner[0] if owner is not None else None

    def load(pointer: Pointer) -> Source | None:
        row = connection.execute(_ROW, {"cid": pointer.source}).first()
        if row is None or row[0] != mine:
            return None
        if pointer.incarnation is not None and row[1] != pointer.incarnation:
            return None
        key = (pointer.source, str(row[1]), pointer.leaf)
        with _sources_lock:
            cached = _sources.get(key)
            if cached is not None:
                _sources.move_to_end(key)
                return cached
        try:
            path = branch_path(connection, pointer.source, pointer.leaf)
        except NotFoundError:
            return None
        on_path = set(path)
        pointers = {
            k: p for k, p in pointers_of(connection, pointer.source).items() if k in on_path
        }
        source = Source(messages_of(connection, pointer.source, path), pointers)
        with _sources_lock:
            _sources[key] = source
            while len(_sources) > CACHED_SOURCES:
                _sources.popitem(last=False)
        return source

    return load


def messages_of(connection: Connection, conversation_id: str, ids: Sequence[int]) -> list[Any]:
    """The whole messages of ``ids`` (text included), in that order."""
    rows: dict[int, Any] = {}
    statement = select(*store.MESSAGE_COLUMNS).where(M.conversation_id == conversation_id)
    for start in range(0, len(ids), ID_CHUNK):
        chunk = list(ids[start : start + ID_CHUNK])
        for row in connection.execute(statement.where(M.id.in_(chunk))):
            rows[int(row[0])] = store.to_msg(row)
    return [rows[mid] for mid in ids if mid in rows]


def attached_rows(connection: Connection, conversation_id: str, ids: set[int]) -> dict[int, Any]:
    """Whole messages of ``ids`` from the sources the conversation attaches (of its owner): the
    text of attached items a summary covers."""
    owner = connection.execute(select(C.owner).where(C.id == conversation_id)).scalar()
    sources = select(A.source_conversation_id).where(A.conversation_id == conversation_id)
    owned = select(C.id).where(
        C.id.in_(sources), C.owner.is_(owner) if owner is None else C.owner == owner
    )
    statement = select(*store.MESSAGE_COLUMNS).where(M.conversation_id.in_(owned))
    found: dict[int, Any] = {}
    wanted = sorted(ids)
    for start in range(0, len(wanted), ID_CHUNK):
        for row in connection.execute(statement.where(M.id.in_(wanted[start : start + ID_CHUNK]))):
            found[int(row[0])] = store.to_msg(row)
    return found


def forget_source(connection: Connection, source: str) -> int:
    """Before ``source`` is erased: delete the summaries of the conversations attaching it that
    may quote its text (each one whose cutoff is at or after its first attachment's open
    marker), so that no request of theirs sends the erased text again; their next compression
    summarizes the fallback instead. The summaries deleted."""
    firsts = connection.execute(
        select(A.conversation_id, func.min(A.open_message_id))
        .where(A.source_conversation_id == source, A.conversation_id != source)
        .group_by(A.conversation_id)
    ).all()
    deleted = 0
    for conversation_id, first in firsts:
        statement = delete(SUMMARIES).where(
            SUMMARIES.c.conversation_id == conversation_id,
            SUMMARIES.c.cutoff_message_id >= first,
        )
        deleted += int(connection.execute(statement).rowcount or 0)
    return deleted


# --- merges ------------------------------------------------------------------------------------


def open_merge(
    connection: Connection,
    conversation_id: str,
    base_head: int | None,
    instruction_id: int,
    peers: Sequence[tuple[str, int | None]],
) -> int:
    """Record a merge waiting for its reply; its id."""
    result = connection.execute(
        MERGES.insert().values(
            conversation_id=conversation_id,
            base_head_id=base_head,
            instruction_message_id=instruction_id,
            peers=[[source, leaf] for source, leaf in peers],
            created_at=utcnow(),
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def commit_merges(
    connection: Connection, conversation_id: str, parent_id: int | None, ids: Sequence[int]
) -> int | None:
    """When the first of ``ids`` (appended after ``parent_id``) is the reply to an open merge's
    instruction, commit the merge: the reply is its commit, and the base peer is unlocked. The
    merge's id, or None."""
    if parent_id is None or not ids:
        return None
    row = connection.execute(
        select(G.id).where(
            G.conversation_id == conversation_id,
            G.instruction_message_id == parent_id,
            G.commit_message_id.is_(None),
        )
    ).first()
    if row is None:
        return None
    merge_id = int(row[0])
    connection.execute(update(MERGES).where(G.id == merge_id).values(commit_message_id=ids[0]))
    connection.execute(update(ATTACHMENTS).where(A.merge_id == merge_id).values(locked=False))
    return merge_id


@dataclass(frozen=True, slots=True, kw_only=True)
class MergeRow:
    """A merge as stored: its commit's parents are ``parents`` (the previous head first)."""

    id: int
    instruction_id: int
    commit_id: int | None
    base_head: int | None
    peers: list[tuple[str, int | None]]

    @property
    def parents(self) -> list[int]:
        """The commit's parents: the target's previous head, then each peer's head."""
        heads = [leaf for _, leaf in self.peers if leaf is not None]
        return [*([self.base_head] if self.base_head is not None else []), *heads]

    def as_dict(self) -> dict[str, Any]:
        return {
            "merge": self.id,
            "instruction": self.instruction_id,
            "commit": self.commit_id,
            "parents": self.parents,
            "peers": [{"conversation": c, "leaf": leaf} for c, leaf in self.peers],
        }


def merges_of(connection: Connection, conversation_id: str) -> list[MergeRow]:
    """The conversation's merges, oldest first."""
    statement = (
        select(G.id, G.instruction_message_id, G.commit_message_id, G.base_head_id, G.peers)
        .where(G.conversation_id == conversation_id)
        .order_by(G.id)
    )
    out = []
    for row in connection.execute(statement):
        peers = _json_list(row[4])
        out.append(
            MergeRow(
                id=int(row[0]),
                instruction_id=int(row[1]),
                commit_id=row[2],
                base_head=row[3],
                peers=[(str(p[0]), p[1]) for p in peers],
            )
        )
    return out


def _json_list(value: Any) -> list[Any]:
    """A stored JSON list column (text on SQLite, decoded on PostgreSQL)."""
    if value is None:
        return []
    decoded = stored_json(value) if isinstance(value, str) else value
    return list(decoded) if isinstance(decoded, list) else []
