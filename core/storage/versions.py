"""A conversation's request version: a few numbers the database gives that change whenever a
stored row the request is assembled from changes.

``core.storage.reuse`` keeps the previous request's read of a conversation and reuses it while
``request_version`` says nothing changed but appended messages. It is keyed on what the
database says, never on time, and is read in the request's own session, in the same query as
the conversation's model and window (the query ``assemble`` starts with anyway).

Every table whose rows the request view reads is summed up by aggregates over the
conversation's rows (``VERSIONED``), each chosen to change with every write that table sees:

- messages are append-only (an edit or a regenerate is a new sibling row), and a recount
  rewrites a row's ``tokens`` and always its ``encoding`` (the basis it was counted on, which
  it leaves for one that is current: ``core.storage.recount``). So they are summed up per
  basis: how many rows, the highest id and the token sum of each. An insert moves its basis's
  count and highest id; a recount moves a row from one basis to another;
- summaries are inserted, and stamped once in place at their first use: count, highest id
  and how many are stamped;
- clearings are insert-only, and a recount moves their ``tokens_reclaimed``: count, highest
  id and that sum;
- the conversation row's ``created_at`` tells a conversation deleted and made again under the
  same id from the one before it; its model and window override are read here as well.

The request profile is not part of the version: it changes with every turn (the request last
sent, the provider's latest reading), and what the read depends on of it, the request's budget,
is worked out anew for every request and passed to the read (``core.storage.reads``). It is read
in the same query all the same (``request_head``), with the conversation's incarnation and
whether it has any attachments: three reads the request path would otherwise make one by one.

- pins are inserted and deleted, never updated: count and highest id (ids only grow, so a set
  of pins with the count and highest id of an earlier one is that set).

A new table that the request view reads adds one line to ``VERSIONED``:
its table and the aggregates that change with each of its writes (``aggregates``: a count and
the highest id for an insert-only table, plus the sum of any column updated in place).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Table, bindparam, func, select, true

from recap.core.errors import NotFoundError
from recap.core.storage import profile as profiles
from recap.core.storage.models import (
    ATTACHMENTS,
    CLEARINGS,
    CONVERSATIONS,
    MESSAGES,
    PINS,
    REQUEST_PROFILES,
    SUMMARIES,
)


def aggregates(table: Table, *summed: Any) -> tuple[ColumnElement[Any], ...]:
    """The usual aggregates of a table's rows in one conversation: their count, their highest
    id, and the total of each column in ``summed`` (a column some write updates in place)."""
    return (
        func.count(),
        func.coalesce(func.max(table.c.id), 0),
        *(func.coalesce(func.sum(column), 0) for column in summed),
    )


# Each table the request view reads besides messages, with aggregates over the conversation's
# rows that change with every write the table sees (in this order in ``RequestVersion.others``).
VERSIONED: tuple[tuple[Table, tuple[ColumnElement[Any], ...]], ...] = (
    # a summary's first use (``core.decision.activation``) stamps ``activated_at`` in place
    (SUMMARIES, (*aggregates(SUMMARIES), func.count(SUMMARIES.c.activated_at))),
    (CLEARINGS, aggregates(CLEARINGS, CLEARINGS.c.tokens_reclaimed)),
    # pins are inserted and deleted (an unpin deletes its row), never updated; ids only grow, so
    # a later set of pins with the same count and highest id as an earlier one is that set
    (PINS, aggregates(PINS)),
)
# Messages, per basis (``encoding``): a row per basis the conversation's rows are counted on.
_BASES = (
    select(MESSAGES.c.encoding, *aggregates(MESSAGES, MESSAGES.c.tokens))
    .where(MESSAGES.c.conversation_id == bindparam("conversation_id"))
    .group_by(MESSAGES.c.encoding)
    .subquery("bases")
)


OTHERS = sum(len(values) for _, values in VERSIONED)  # the aggregates of ``VERSIONED``


def _statement() -> Any:
    """A row per basis of the conversation's messages (one with nulls when it has none), each
    with the conversation's model, window override and creation time and every aggregate of
    ``VERSIONED`` (each table's an aggregate subquery joined on true: one row); then its
    incarnation, whether it has attachments, and its request profile (``profile.COLUMNS``
    after the profile's conversation id, null without a profile)."""
    conversation: Any = bindparam("conversation_id")
    c = CONVERSATIONS.c
    columns: list[Any] = [c.model, c.max_input_tokens, c.created_at, *_BASES.c]
    joined: Any = CONVERSATIONS.outerjoin(_BASES, true())
    for index, (table, values) in enumerate(VERSIONED):
        labelled = [value.label(f"v{number}") for number, value in enumerate(values)]
        part = (
            select(*labelled).where(table.c.conversation_id == conversation).subquery(f"t{index}")
        )
        columns.extend(part.c)
        joined = joined.join(part, true())
    attached = select(ATTACHMENTS.c.id).where(ATTACHMENTS.c.conversation_id == conversation)
    profile = REQUEST_PROFILES.c
    columns += [c.incarnation, attached.exists().label("attached"), profile.conversation_id]
    columns += profiles.COLUMNS
    joined = joined.outerjoin(REQUEST_PROFILES, profile.conversation_id == c.id)
    return select(*columns).select_from(joined).where(c.id == conversation)


_VERSION = _statement()
Basis = tuple[str, int, int, int]  # a basis, its rows' count, highest id and token sum
_HEAD = 7 + OTHERS  # where the incarnation, the attachments and the profile start in a row


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestVersion:
    """The conversation's model and window override, and its request version: equal versions
    mean the stored rows the request is assembled from are the same; versions equal but for
    ``messages`` mean the same but for messages added or recounted."""

    model: str
    max_input_tokens: int | None
    created_at: datetime
    messages: tuple[Basis, ...]  # per basis, in basis order
    others: tuple[int, ...]  # the aggregates of ``VERSIONED``, in order

    @property
    def highest_message(self) -> int:
        """The highest message id (0 for none)."""
        return max((basis[2] for basis in self.messages), default=0)

    def same_but_messages(self, other: RequestVersion) -> bool:
        """Whether only messages may differ between the two versions."""
        return self.created_at == other.created_at and self.others == other.others


@dataclass(frozen=True, slots=True)
class RequestHead:
    """What a request reads first, in one query: the version, the conversation's incarnation
    (``store.Identity``), whether any attachment points into it (none: nothing to expand), and
    its request profile (None before anything was recorded)."""

    version: RequestVersion
    incarnation: str | None
    attached: bool
    profile: profiles.Profile | None


def request_version(connection: Connection, conversation_id: str) -> RequestVersion:
    """The conversation's request version (one query), or a ``NotFoundError``."""
    return request_head(connection, conversation_id).version


def request_head(connection: Connection, conversation_id: str) -> RequestHead:
    """The conversation's request version, incarnation, attachments and profile (one query),
    or a ``NotFoundError``."""
    rows = connection.execute(_VERSION, {"conversation_id": conversation_id}).all()
    if not rows:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    first = rows[0]
    model, window, created_at = first[:3]
    bases = sorted(
        (str(row[3]), int(row[4]), int(row[5]), int(row[6])) for row in rows if row[3] is not None
    )
    version = RequestVersion(
        model=str(model),
        max_input_tokens=window,
        created_at=created_at,
        messages=tuple(bases),
        others=tuple(int(value) for value in first[7:_HEAD]),
    )
    incarnation, attached, profiled = first[_HEAD : _HEAD + 3]
    profile = profiles.profile_of(first[_HEAD + 3 :]) if profiled is not None else None
    return RequestHead(
        version, str(incarnation) if incarnation is not None else None, bool(attached), profile
    )


def grown_by(messages: tuple[Basis, ...], rows: list[tuple[str, int, int]]) -> tuple[Basis, ...]:
    """``messages`` (``RequestVersion.messages``) after the rows (basis, id, tokens) were
    added: what the version says when nothing else changed."""
    by_basis = {basis: (count, highest, total) for basis, count, highest, total in messages}
    for basis, mid, count in rows:
        had, highest, total = by_basis.get(basis, (0, 0, 0))
        by_basis[basis] = (had + 1, max(highest, mid), total + count)
    return tuple(sorted((basis, *values) for basis, values in by_basis.items()))
