"""Hot-path reads for the request view: what ``core.request.assembly.assemble`` needs of one branch.

A long conversation sends only its newest part: 5,000 stored messages under a 128k window send
about a fifth of them. So the branch is found from the tree index alone (ids, parents and stored
counts), the counts tell how far back a request within the budget can reach, and full rows are
read only that far, in one range (further only as ``assembly.omittable`` asks): the cost of a
request follows what is sent, not what is stored. Core selects (no ORM); JSON columns are read as
text and decoded only when they hold a value, since most rows hold a JSON null there.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import accumulate
from typing import Any

import orjson
from sqlalchemy import Connection, Select, Text, and_, bindparam, func, or_, select, type_coerce
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlmodel import Session

from recap.core.counting import media
from recap.core.errors import NotFoundError
from recap.core.request import assembly
from recap.core.request.branch import branch_ids
from recap.core.request.pins import effective_clearings
from recap.core.storage import activation, compressed, store
from recap.core.storage.models import CONVERSATIONS, MESSAGES
from recap.core.storage.pins import load_pins
from recap.core.values.records import SYSTEM_ROLES, ClearingRec, Msg, SummaryRec

READ_MARGIN = 32  # rows read beyond those the budget's tokens reach: a unit's call and results
JSON_COLUMNS = frozenset({"tool_calls", "content_parts", "extra"})
COLUMNS = (
    *(
        type_coerce(column, Text) if column.name in JSON_COLUMNS else column
        for column in store.MESSAGE_COLUMNS
    ),
    MESSAGES.c.encoding,  # what the stored count was made with (core.storage.recount reads it)
)
BASIS = len(store.MESSAGE_COLUMNS)  # the position of ``encoding`` in COLUMNS
PARENT, ROLE, TOKENS, TOOL_CALLS, TOOL_CALL_ID = 1, 2, 4, 5, 6  # in store.MESSAGE_COLUMNS
PARTS = [column.name for column in store.MESSAGE_COLUMNS].index("content_parts")
# Statements built once, with parameters: building one costs several times what running it does.
_IN_CONVERSATION = MESSAGES.c.conversation_id == bindparam("conversation_id")
ID_CHUNK = 500  # ids per IN list: far below every bound-parameter limit
_HEAD = select(CONVERSATIONS.c.model, CONVERSATIONS.c.max_input_tokens).where(
    CONVERSATIONS.c.id == bindparam("conversation_id")
)
_PARENTS = (  # in id order, the index on (conversation, id, parent, tokens) read in sequence
    select(MESSAGES.c.id, MESSAGES.c.parent_id, MESSAGES.c.tokens)
    .where(_IN_CONVERSATION)
    .order_by(MESSAGES.c.id)
)
_ORDERED = _PARENTS.subquery()
# Ids, parents and tokens as three JSON arrays: three strings to decode, not a row per message.
_AGGREGATED_PARENTS = {
    "sqlite": select(
        func.json_group_array(_ORDERED.c.id),
        func.json_group_array(_ORDERED.c.parent_id),
        func.json_group_array(_ORDERED.c.tokens),
    ),
    "postgresql": select(
        func.json_agg(aggregate_order_by(MESSAGES.c.id, MESSAGES.c.id)),
        func.json_agg(aggregate_order_by(MESSAGES.c.parent_id, MESSAGES.c.id)),
        func.json_agg(aggregate_order_by(MESSAGES.c.tokens, MESSAGES.c.id)),
    ).where(_IN_CONVERSATION),
}
_BY_IDS = select(*COLUMNS).where(
    _IN_CONVERSATION, MESSAGES.c.id.in_(bindparam("ids", expanding=True))
)
_ROWS = select(*COLUMNS).where(  # one id range and two single rows, each an index search
    or_(
        and_(_IN_CONVERSATION, MESSAGES.c.id == bindparam("one")),
        and_(_IN_CONVERSATION, MESSAGES.c.id == bindparam("other")),
        and_(
            _IN_CONVERSATION,
            MESSAGES.c.id >= bindparam("low"),
            MESSAGES.c.id <= bindparam("high"),
        ),
    )
)


@dataclass(frozen=True, kw_only=True)
class RequestBranch:
    """What one request is assembled from, read in one session."""

    branch: list[Msg]  # the stored prompt, the summary's cutoff, then the messages to consider
    summary: SummaryRec | None
    clearings: dict[int, ClearingRec]
    omitted: list[int]  # older messages after the cutoff, left unread: they cannot fit
    bases: dict[int, str] = field(default_factory=dict)  # each message's count basis (recount)
    omitted_tokens: int = 0  # the tokens of the omitted messages as sent
    # The branch's pinned messages, root first (those the summary covers read for this alone);
    # ``clearings`` holds none of theirs (``core.request.pins.effective_clearings``).
    pinned: list[Msg] = field(default_factory=list)
    # The first message of the branch (``Tree.branch_root``): its prompt cache key is of it.
    root: int | None = None
    choice: activation.Choice | None = None  # a ready summary used now or left waiting


def conversation_head(session: Session, conversation_id: str) -> tuple[str, int | None]:
    """The conversation's model and window override, or a ``NotFoundError``."""
    head = session.connection().execute(_HEAD, {"conversation_id": conversation_id}).first()
    if head is None:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    return str(head[0]), head[1]


def load_request_branch(
    session: Session,
    conversation_id: str,
    leaf: int | None,
    budget: int | Callable[[int], int] | None,
    as_of: datetime | None = None,
    activating: activation.Context | None = None,
) -> RequestBranch:
    """The branch ending at ``leaf`` (default: the latest message), without the oldest messages
    after the cutoff that no request within ``budget`` tokens can hold (None: read them all).
    ``budget`` may be a function of the branch's leaf id (the calibration is weighted by how far
    the branch moved past its reading), asked once the leaf is known. With ``as_of``, only the
    summaries and clearings recorded by then apply (and the pins made by then).

    A pinned message is never left unread: the messages left out stop before the first one
    after the cutoff, and those the summary covers are read on their own."""
    connection = session.connection()
    tree = read_tree(connection, conversation_id)
    path = tree.path(conversation_id, leaf)
    summaries = compressed.load_summaries(session, conversation_id, as_of)
    clearings = compressed.load_clearings(session, conversation_id, as_of)
    pins = load_pins(connection, conversation_id, as_of)
    rows = Rows(connection, conversation_id)
    tokens_along = tree.tokens_along(path)
    root = tree.branch_root(path)
    return request_branch(
        rows,
        path,
        tokens_along,
        summaries,
        clearings,
        budget,
        pins,
        root=root,
        activating=activating,
    )


def request_branch(  # noqa: PLR0913 - the parts of a read, and the choice of summary
    rows: Rows,
    path: list[int],
    stored_tokens: list[int],
    summaries: list[SummaryRec],
    clearings: dict[int, ClearingRec],
    budget: int | Callable[[int], int] | None,
    pins: frozenset[int] = frozenset(),
    *,
    root: int | None = None,
    activating: activation.Context | None = None,
) -> RequestBranch:
    """``load_request_branch`` once the branch's ``path`` (with each message's stored count,
    read from the tree index), the conversation's summaries, clearings and pinned messages are
    known: the rows read through ``rows`` (which may hold some already, read by an earlier
    request: ``core.storage.reuse``; only the others are read).

    The counts bound what each message can take as sent (a cleared result at its placeholder
    size; media can count less), so they tell which rows a request within the budget can need
    before any is read: those rows are read in one range (the usual turn: all of the branch
    after the cutoff), the walk that decides what is left out (``assembly.omittable``) reads
    further only when a message counts less as sent than stored, and the tokens left out are
    summed from the counts, with no read."""
    if callable(budget):
        budget = budget(path[-1]) if path else None
    choice = activation.choose(summaries, path, stored_tokens, clearings, budget, activating)
    summary, clearings = choice.summary, choice.clearings
    pinned_ids = [mid for mid in path if mid in pins] if pins else []
    if pinned_ids:
        clearings = dict(effective_clearings(clearings, pinned_ids))
    if not path:
        return RequestBranch(
            branch=[], summary=summary, clearings=clearings, omitted=[], choice=choice
        )
    cutoff = summary.cutoff_message_id if summary is not None else path[0]
    low = path.index(cutoff) + 1  # the first message after the cutoff
    counts = _SentCounts(path, stored_tokens, clearings)
    start = low if budget is None else max(low, counts.reach(len(path) - 1, budget) - READ_MARGIN)
    rows.fetch(path[start:], also=(path[0], cutoff))  # what the budget can hold, root, cutoff
    heads = [path[0]] if rows.by_id[path[0]][ROLE] in SYSTEM_ROLES else []
    first = len(heads)
    if summary is not None and cutoff not in heads:
        first = low
        heads.append(cutoff)
    after = path[first:]
    if budget is None or counts.between(first, len(path)) <= budget:  # the usual turn: no walk
        skip = 0
    else:
        skip = _omittable(after, rows, clearings, budget, counts, first)
    if skip and pinned_ids:  # a pinned message is sent whatever the budget: read its unit on
        first_pin = next((i for i, mid in enumerate(after[:skip]) if mid in pins), skip)
        if first_pin < skip:
            skip = _unit_start(after, first_pin, rows)
    rows.fetch([mid for mid in after[skip:] if mid not in rows.by_id])
    rows.fetch_ids([mid for mid in pinned_ids if mid not in rows.by_id])
    sent = [*heads, *after[skip:]]
    return RequestBranch(
        branch=[rows.msg(mid) for mid in sent],
        summary=summary,
        clearings=clearings,
        omitted=after[:skip],
        bases={mid: rows.by_id[mid][BASIS] for mid in sent},
        omitted_tokens=counts.between(first, first + skip),
        pinned=[rows.msg(mid) for mid in pinned_ids],
        root=path[0] if root is None else root,
        choice=choice,
    )


class _SentCounts:
    """The messages of a path as sent at most: each one's stored count, a cleared result's less
    the tokens its clearing reclaimed, with the sums from the newest back made once (in C:
    ``accumulate``) so that any range's total is a subtraction."""

    def __init__(
        self, path: list[int], stored: list[int], clearings: dict[int, ClearingRec]
    ) -> None:
        counts = stored
        if clearings:
            counts = list(stored)
            for mid, cleared in clearings.items():
                at = bisect_left(path, mid)  # a path's ids ascend: a parent is stored first
                if at < len(path) and path[at] == mid:
                    counts[at] -= cleared.tokens_reclaimed
        self.size = len(counts)
        self.back = [0, *accumulate(reversed(counts))]  # back[k]: the newest k messages' total

    def between(self, low: int, high: int) -> int:
        """The total of the messages at ``low`` up to (not including) ``high``."""
        return self.back[self.size - low] - self.back[self.size - high]

    def reach(self, end: int, room: int) -> int:
        """Where the messages up to ``end`` (inclusive) start adding up, from ``end`` back, to
        more than ``room``; 0 when all of them do not."""
        target = room + self.back[self.size - 1 - end]
        newest = bisect_right(self.back, target)  # the fewest newest messages over the target
        return max(self.size - newest, 0)


def load_whole_branch(
    session: Session,
    conversation_id: str,
    leaf: int | None = None,
    activating: activation.Context | None = None,
) -> RequestBranch:
    """Every message from the root to ``leaf`` (default: the latest message), with content, and
    the summary and clearings that apply (a ready summary as ``activating`` chooses, else the
    one in use): what ``export`` prints and what the request view is checked against. The
    request path reads less (``load_request_branch``)."""
    conversation_head(session, conversation_id)
    connection = session.connection()
    path = branch_path(connection, conversation_id, leaf)
    rows = Rows(connection, conversation_id)
    rows.fetch(path)
    pins = load_pins(connection, conversation_id)
    branch = [rows.msg(mid) for mid in path]
    summaries = compressed.load_summaries(session, conversation_id)
    clearings = compressed.load_clearings(session, conversation_id)
    choice = activation.choose(
        summaries, path, [m.tokens for m in branch], clearings, None, activating
    )
    return RequestBranch(
        branch=branch,
        summary=choice.summary,
        clearings=dict(effective_clearings(choice.clearings, pins)),
        omitted=[],
        bases={mid: rows.by_id[mid][BASIS] for mid in path},
        pinned=[m for m in branch if m.id in pins],
        root=path[0] if path else None,
        choice=choice,
    )


def leaf_at(session: Session, conversation_id: str, moment: datetime) -> int:
    """The newest message of the conversation stored at or before ``moment`` (the branch head
    then), or a ``NotFoundError``."""
    conversation_head(session, conversation_id)
    m = MESSAGES.c
    statement = select(func.max(m.id)).where(
        m.conversation_id == conversation_id, m.created_at <= moment
    )
    leaf = session.connection().execute(statement).scalar()
    if leaf is None:
        raise NotFoundError(
            f"conversation {conversation_id!r} has no message at or before {moment.isoformat()}"
        )
    return int(leaf)


def branch_path(connection: Connection, conversation_id: str, leaf: int | None) -> list[int]:
    """The ids from the root to ``leaf`` (default: the latest message), found in the
    conversation's tree (``read_tree``)."""
    return read_tree(connection, conversation_id).path(conversation_id, leaf)


def path_to(
    ids: list[int], parents: list[int | None], conversation_id: str, leaf: int | None
) -> list[int]:
    """The ids from the root to ``leaf`` (default: the latest message) among the
    conversation's ``ids`` (ascending) and their ``parents``. A conversation that never forked
    (each message the child of the one before it: compared as whole lists, not in a Python
    loop) has its path without a walk; one with forks is walked from the leaf up."""
    if not ids:
        if leaf is not None:
            raise NotFoundError(f"message {leaf} is not in conversation {conversation_id!r}")
        return []
    leaf = ids[-1] if leaf is None else leaf
    if parents[0] is None and parents[1:] == ids[:-1]:  # one chain
        end = bisect_left(ids, leaf)
        if end == len(ids) or ids[end] != leaf:
            raise NotFoundError(f"message {leaf} is not in conversation {conversation_id!r}")
        return ids[: end + 1]
    parent_of = dict(zip(ids, parents, strict=True))
    if leaf not in parent_of:
        raise NotFoundError(f"message {leaf} is not in conversation {conversation_id!r}")
    return branch_ids(parent_of, leaf)


@dataclass(frozen=True, slots=True)
class Tree:
    """A conversation's messages as its tree index holds them: every id (ascending), each
    one's parent and its stored token count."""

    ids: list[int]
    parents: list[int | None]
    tokens: list[int]

    def path(self, conversation_id: str, leaf: int | None) -> list[int]:
        """The ids from the root to ``leaf`` (default: the latest message): ``path_to``."""
        return path_to(self.ids, self.parents, conversation_id, leaf)

    def tokens_along(self, path: list[int]) -> list[int]:
        """The stored counts of the messages of ``path``, in its order."""
        ids, size = self.ids, len(path)
        if size and size <= len(ids) and ids[size - 1] == path[-1]:
            return self.tokens[:size]  # the path is the first ids: ascending, none missing
        return [self.tokens[bisect_left(ids, mid)] for mid in path]

    def branch_root(self, path: list[int]) -> int | None:
        """The first message of the branch ``path`` is on: the newest message of it added after
        a sibling (an edit or a retry starts a branch there), else the root. Stable: a sibling
        added later has a newer id, so it never changes the answer for ``path``."""
        if not path:
            return None
        ids, size = self.ids, len(path)
        if size <= len(ids) and ids[size - 1] == path[-1]:
            return path[0]  # the path is the first ids: no message of it has an older sibling
        on_path = set(path)
        first: dict[int, int] = {}
        for mid, parent in zip(ids, self.parents, strict=True):
            if parent is not None and parent in on_path:
                first.setdefault(parent, mid)  # ids ascend: the oldest child
        for at in range(len(path) - 1, 0, -1):
            if first.get(path[at - 1]) != path[at]:
                return path[at]
        return path[0]

    def grown(self, rows: list[tuple[Any, ...]]) -> Tree:
        """This tree with message ``rows`` (full rows, ascending ids, newer than its last)."""
        return Tree(
            [*self.ids, *(int(row[0]) for row in rows)],
            [*self.parents, *(row[PARENT] for row in rows)],
            [*self.tokens, *(int(row[TOKENS]) for row in rows)],
        )


def read_tree(connection: Connection, conversation_id: str) -> Tree:
    """The conversation's ``Tree``, from its tree index alone (migration 0012)."""
    params = {"conversation_id": conversation_id}
    aggregate = _AGGREGATED_PARENTS.get(connection.dialect.name)
    if aggregate is None:
        rows = plain_rows(connection, _PARENTS, params)
        return Tree([row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows])
    ids_json, parents_json, tokens_json = connection.execute(aggregate, params).one()
    ids, parents = _json_list(ids_json), _json_list(parents_json)
    tokens = _json_list(tokens_json)
    if ids != sorted(ids):  # an aggregate's order is the scan's in practice, not by contract
        triples = sorted(zip(ids, parents, tokens, strict=True))
        ids, parents, tokens = (
            [t[0] for t in triples],
            [t[1] for t in triples],
            [t[2] for t in triples],
        )
    return Tree(ids, parents, tokens)


def _json_list(value: Any) -> list[Any]:
    """An aggregate's array of integers of a 64-bit column (or nulls), which orjson reads
    exactly."""
    if value is None:
        return []
    return list(orjson.loads(value) if isinstance(value, str) else value)


UNIT_LOOKBACK = 64  # rows read before a pinned result to find the call it answers


def _unit_start(after: list[int], index: int, rows: Rows) -> int:
    """Where the unit of message ``index`` starts: a tool result belongs to the assistant
    message before it that made its call (with that call's other results in between)."""
    low = max(0, index - UNIT_LOOKBACK)
    rows.fetch([mid for mid in after[low : index + 1] if mid not in rows.by_id])
    start = index
    while start > low and rows.by_id[after[start]][ROLE] == "tool":
        start -= 1
    return start if rows.by_id[after[start]][ROLE] != "tool" else index


def _omittable(
    after: list[int],
    rows: Rows,
    clearings: dict[int, ClearingRec],
    budget: int,
    counts: _SentCounts,
    first: int,
) -> int:
    """``assembly.omittable`` over the messages ``after`` the cutoff (at ``first`` in the path
    ``counts`` describes), reading rows newest first: when the walk meets a row not read, the
    rows back to where the counts reach the budget it has left (and ``READ_MARGIN`` more)."""
    spent = 0  # what the walk has counted so far

    def row_at(index: int) -> assembly.LightRow:
        nonlocal spent
        mid = after[index]
        if mid not in rows.by_id:
            start = counts.reach(first + index, budget - spent) - first - READ_MARGIN
            rows.fetch(after[max(0, min(start, index - READ_MARGIN)) : index + 1])
        row = rows.by_id[mid]
        cleared = clearings.get(mid)
        count = row[TOKENS] - (cleared.tokens_reclaimed if cleared is not None else 0)
        if cleared is None and holds_media(row[PARTS]):
            count = 0  # its media may be sent as placeholders: only a lower bound is known
        spent += count
        return row[ROLE], count, row[TOOL_CALL_ID]

    def calls_of(index: int) -> set[str]:
        return {str(call.get("id", "")) for call in rows.calls(after[index])}

    return assembly.omittable(len(after), budget, row_at, calls_of)


@dataclass(frozen=True, slots=True)
class HeldRows:
    """The rows one read held, and the values made of them, kept past its session."""

    by_id: dict[int, Any]
    calls: dict[int, list[dict[str, Any]]]
    msgs: dict[int, Msg]


class Rows:
    """Full message rows of one conversation by id, read by ranges of ascending ids."""

    def __init__(
        self, connection: Connection, conversation_id: str, held: HeldRows | None = None
    ) -> None:
        """Rows read through ``connection``; with ``held``, starting from the rows (and the
        values made of them) that a read of the same conversation, unchanged since, held."""
        self.connection = connection
        self.conversation_id = conversation_id
        self.by_id: dict[int, Any] = dict(held.by_id) if held is not None else {}
        self._calls: dict[int, list[dict[str, Any]]] = dict(held.calls) if held else {}
        self._msgs: dict[int, Msg] = dict(held.msgs) if held is not None else {}

    def held(self) -> HeldRows:
        """What these rows hold, to start a later read from (``core.storage.reuse``)."""
        return HeldRows(self.by_id, self._calls, self._msgs)

    def fetch(self, ids: list[int], also: tuple[int, int] | None = None) -> None:
        """Read the rows of ``ids`` (ascending) in one range query, and the two rows ``also``
        names; rows of other branches in the range are skipped."""
        known = self.by_id
        ids = [mid for mid in ids if mid not in known]
        pair = [mid for mid in also or () if mid not in known]
        if not ids and not pair:
            return
        ids = ids or pair[:1]
        one, other = (*pair, ids[0], ids[0])[:2]
        params = {
            "conversation_id": self.conversation_id,
            "one": one,
            "other": other,
            "low": ids[0],
            "high": ids[-1],
        }
        wanted = {*ids, one, other}
        self.by_id.update(
            (row[0], row) for row in plain_rows(self.connection, _ROWS, params) if row[0] in wanted
        )

    def fetch_ids(self, ids: list[int]) -> None:
        """Read the rows of scattered ``ids`` (a few: the pinned messages a summary covers)."""
        for start in range(0, len(ids), ID_CHUNK):
            params = {"conversation_id": self.conversation_id, "ids": ids[start : start + ID_CHUNK]}
            self.by_id.update((row[0], row) for row in plain_rows(self.connection, _BY_IDS, params))

    def calls(self, mid: int) -> list[dict[str, Any]]:
        """The decoded tool calls of a message (decoded once)."""
        calls = self._calls.get(mid)
        if calls is None:
            calls = self._calls[mid] = json_value(self.by_id[mid][TOOL_CALLS]) or []
        return calls

    def msg(self, mid: int) -> Msg:
        """The row as a ``Msg`` (positional: this runs for every message sent), made once."""
        made = self._msgs.get(mid)
        if made is None:
            made = self._msgs[mid] = self._made(mid)
        return made

    def _made(self, mid: int) -> Msg:
        row = self.by_id[mid]
        _, parent, role, content, count, _, call_id, name, parts, extra, path, size, _ = row
        parts, extra = json_value(parts), json_value(extra)
        return Msg(
            mid,
            parent,
            role,
            content,
            count,
            tuple(self.calls(mid)),
            call_id,
            name,
            tuple(parts) if parts is not None else None,
            extra,
            path,
            size,
        )


def holds_media(parts: Any) -> bool:
    """Whether stored content parts hold media (``core.counting.media``), from the column's text or
    its decoded value, without decoding the text."""
    if isinstance(parts, str):
        return f'"{media.META_KEY}"' in parts
    return isinstance(parts, list) and any(
        isinstance(p, dict) and media.META_KEY in p for p in parts
    )


def plain_rows(
    connection: Connection, statement: Select[Any], params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """The rows of ``statement`` as the driver's own tuples.

    SQLAlchemy compiles and runs the statement (any dialect), but the rows are fetched from its
    DBAPI cursor: building a ``Row`` per result costs as much as the read itself on these wide
    reads, and the columns read here need no type processing (integers and text; a JSON column
    comes back as text on SQLite and decoded on PostgreSQL, which ``json_value`` takes both).
    """
    result = connection.execute(statement, params)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def json_value(value: Any) -> Any:
    if value is None or value == "null":
        return None
    return stored_json(value) if isinstance(value, str) else value


def stored_json(text: str) -> Any:
    """A stored JSON column's text decoded, the value ``json.loads`` gives: by orjson (a few
    times faster on the tool calls and parts of every row a request reads), else by ``json``.
    ``json`` decides what orjson refuses (``NaN``, ``Infinity``, a lone surrogate, a number past
    a double) and every text with nineteen digits in a row: orjson reads an integer past 64 bits
    as a float, and any integer near that size is written with as many digits. Held equal by a
    seeded comparison (tests/test_stored_json.py)."""
    try:
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return json.loads(text)
    if _DIGIT_RUN not in data.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


# Every ASCII digit as "0", every other byte as a space: a run of nineteen digits is then a run
# of nineteen zeros, found at C speed (a regular expression took longer than the parse).
_DIGITS_ONLY = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(" ") for b in range(256))
_DIGIT_RUN = b"0" * 19
