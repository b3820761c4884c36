"""The previous request's read of a conversation, reused for the next one while the database
says nothing changed but messages appended.

A client's next turn is its last one plus a message or two, yet a request read from scratch
walks the conversation's ids and parents, its summaries and clearings, and the rows it sends.
``BranchReuse`` keeps, per conversation, what the last read of it held: every id and parent,
the summaries and clearings, the rows read (and the ``Msg`` values made of them), stamped with
the ``core.storage.versions.RequestVersion`` read first in that request's session. The next
request reads the version first, in the same query as the conversation's model; when only
messages may differ and the rows past the last highest id account for every change (their
count, and their tokens for the token sum), those rows are all it reads: the branch, the
applicable summary, what is omitted and what is sent are worked out from the rest as a fresh
read would (``core.storage.reads.request_branch``), and any row the request needs that was
not held is read then. Any other change (a summary, a clearing, a recount, the conversation
made anew) reads afresh. The result equals a fresh read, value for value; a seeded test holds
the two equal through random messages, forks, summaries, clearings, recounts and profile
changes (tests/test_assembly_reuse.py).

In memory, per process, for the ``SIZE`` conversations used last; the database stays the only
truth (a version read in the request's session decides every use).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlmodel import Session

from recap.core.storage import activation, compressed, reads
from recap.core.storage.models import MESSAGES
from recap.core.storage.pins import load_pins
from recap.core.storage.versions import RequestVersion, grown_by
from recap.core.values.records import ClearingRec, SummaryRec

SIZE = 64  # conversations whose last read is kept
_AFTER = select(*reads.COLUMNS).where(  # the rows stored since a read: one index range
    MESSAGES.c.conversation_id == bindparam("conversation_id"),
    MESSAGES.c.id > bindparam("after"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldRead:
    """What one read of a conversation held, at ``version``."""

    version: RequestVersion
    tree: reads.Tree  # every message id, ascending, with its parent and stored count
    summaries: list[SummaryRec]
    clearings: dict[int, ClearingRec]
    rows: reads.HeldRows
    pins: frozenset[int] = frozenset()  # the pinned messages' ids


class BranchReuse:
    """The last request read of the ``size`` conversations used last (thread-safe)."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._reads: OrderedDict[str, HeldRead] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0  # reads that started from the last one
        self.misses = 0  # reads made afresh

    def get(self, conversation_id: str) -> HeldRead | None:
        with self._lock:
            held = self._reads.get(conversation_id)
            if held is not None:
                self._reads.move_to_end(conversation_id)
            return held

    def put(self, conversation_id: str, held: HeldRead) -> None:
        with self._lock:
            self._reads[conversation_id] = held
            self._reads.move_to_end(conversation_id)
            while len(self._reads) > self.size:
                self._reads.popitem(last=False)

    def count(self, *, hit: bool) -> None:
        with self._lock:
            if hit:
                self.hits += 1
            else:
                self.misses += 1

    def __len__(self) -> int:
        return len(self._reads)


def load_request_branch(
    session: Session,
    conversation_id: str,
    leaf: int | None,
    budget: int | Callable[[int], int] | None,
    version: RequestVersion,
    reuse: BranchReuse,
    activating: activation.Context | None = None,
) -> reads.RequestBranch:
    """``core.storage.reads.load_request_branch`` (without ``as_of``), starting from the
    conversation's last read when ``version``, read first in this ``session``, allows it."""
    connection = session.connection()
    held = reuse.get(conversation_id)
    grown = _grown(connection, conversation_id, held, version) if held is not None else None
    reuse.count(hit=grown is not None)
    if grown is not None and held is not None:
        tree, rows = grown
        summaries, clearings, pins = held.summaries, held.clearings, held.pins
    else:
        tree = reads.read_tree(connection, conversation_id)
        summaries = compressed.load_summaries(session, conversation_id)
        clearings = compressed.load_clearings(session, conversation_id)
        pins = load_pins(connection, conversation_id)
        rows = reads.Rows(connection, conversation_id)
    path = tree.path(conversation_id, leaf)
    tokens = tree.tokens_along(path)
    root = tree.branch_root(path)
    loaded = reads.request_branch(
        rows, path, tokens, summaries, clearings, budget, pins, root=root, activating=activating
    )
    held_now = HeldRead(
        version=version,
        tree=tree,
        summaries=summaries,
        clearings=clearings,
        rows=rows.held(),
        pins=pins,
    )
    reuse.put(conversation_id, held_now)
    return loaded


def _grown(
    connection: Connection, conversation_id: str, held: HeldRead, version: RequestVersion
) -> tuple[reads.Tree, reads.Rows] | None:
    """The held read's tree and rows, grown by the messages stored since, when those account
    for every change ``version`` shows (so no held count was made anew); else None (read
    afresh)."""
    before = held.version
    if not version.same_but_messages(before):
        return None
    new: list[tuple[Any, ...]] = []
    if version.messages != before.messages:
        params = {"conversation_id": conversation_id, "after": before.highest_message}
        new = sorted(reads.plain_rows(connection, _AFTER, params), key=lambda row: int(row[0]))
    added_rows = [(str(row[reads.BASIS]), int(row[0]), int(row[reads.TOKENS])) for row in new]
    if grown_by(before.messages, added_rows) != version.messages:
        return None  # a row was recounted, or another one came meanwhile: read afresh
    rows = reads.Rows(connection, conversation_id, held=held.rows)
    last = held.tree.ids[-1] if held.tree.ids else 0
    added = [row for row in new if int(row[0]) > last]  # a fresh read may have seen some
    rows.by_id.update((int(row[0]), row) for row in new)
    return held.tree.grown(added), rows


__all__ = ["SIZE", "BranchReuse", "HeldRead", "load_request_branch"]
