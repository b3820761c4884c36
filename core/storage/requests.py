"""``recap serve``'s writes: a resent history mapped onto the stored branch, the messages after a
named one, and the model's reply; each in one short transaction that holds the conversation's
append lock, the one ``store.append_messages`` takes (``store.lock_conversation``), so two
processes serving one conversation, or serve and a host's ``Recap.add``, never fork it."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine, and_, bindparam, or_, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from recap.core.errors import NotFoundError
from recap.core.request.prefix import Node, longest_stored_prefix, open_calls
from recap.core.request.validate import check_message, check_tool_pairing
from recap.core.storage import attachments, store
from recap.core.storage.db import session_scope
from recap.core.storage.hashing import message_hash
from recap.core.storage.models import CONVERSATIONS, MESSAGES
from recap.core.storage.outputs import Ingest
from recap.core.values.records import SYSTEM_ROLES
from recap.core.values.serving import Mapped, Owner, Resolved

HASH_BATCH = 500  # hashes per IN list: far below every driver's parameter limit
CREATE_ATTEMPTS = 2  # a write that still meets another's new row is retried once
SEEN_CONVERSATIONS = 256  # conversations whose last request is kept to skip rehashing its history
SCOPE_MARK = "~"  # between a client's name and the digest of a key-scoped conversation id
SCOPE_DIGEST_CHARS = 24  # 96 bits of the key's fingerprint and the name: no two keys share one
SCOPE_SALT = b"recap-serve-scope:"  # a scoped id's digest is no plain hash of what it mixes
MAX_ID_CHARS = 255  # the conversations.id column


@dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """A conversation's last request: its messages as sent, as checked, and their hashes; once
    stored, their ids, and the hash and id of the reply stored after them."""

    sent: list[Any]
    checked: list[dict[str, Any]]
    hashes: list[str]
    path: tuple[int, ...] = ()
    reply: tuple[str, int] | None = None
    open_calls: Counter[str] = field(default_factory=Counter)  # open after ``checked``


class SeenRequests:
    """The last request of recently used conversations, so that a resent history is checked and
    hashed only past the part it repeats (a client resends the whole history every turn: the
    messages equal to last time's have last time's hashes). In memory, the least recently used
    conversations dropped past ``size``; the stored tree stays the only truth, this only saves
    recomputing what the request repeats."""

    def __init__(self, size: int = SEEN_CONVERSATIONS) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, str], Seen] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> Seen | None:
        with self._lock:
            seen = self._entries.get(key)
            if seen is not None:
                self._entries.move_to_end(key)
            return seen

    def put(self, key: tuple[str, str], seen: Seen) -> None:
        with self._lock:
            self._entries[key] = seen
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def record_reply(
        self, key: tuple[str, str], leaf_id: int | None, reply: tuple[str, int]
    ) -> None:
        """The reply (hash, id) stored after ``leaf_id``, kept when it ends the last request."""
        with self._lock:
            seen = self._entries.get(key)
            if seen is not None and seen.path and seen.path[-1] == leaf_id:
                self._entries[key] = replace(seen, reply=reply)

    def drop(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


def checked_and_hashed(messages: Sequence[Any], previous: Seen | None) -> Seen:
    """The request's history checked (tool results paired with calls) and hashed; the messages
    equal to ``previous``'s, from the first on, reuse its checks and hashes."""
    reused = 0
    if previous is not None:
        limit = min(len(messages), len(previous.sent))
        while reused < limit and messages[reused] == previous.sent[reused]:
            reused += 1
        checked = previous.checked[:reused]
        hashes = previous.hashes[:reused]
    else:
        checked, hashes = [], []
    for index in range(reused, len(messages)):
        message = check_message(messages[index], f"messages[{index}]")
        checked.append(message)
        hashes.append(message_hash(message))
    if previous is not None and reused == len(previous.checked):  # paired up to there already
        pending = check_tool_pairing(
            checked[reused:], "messages", previous.open_calls, first_index=reused
        )
    else:
        pending = check_tool_pairing(checked, "messages")
    return Seen(sent=list(messages), checked=checked, hashes=hashes, open_calls=pending)


def known_path(request: Seen, previous: Seen | None) -> list[int]:
    """Stored ids of the request's first messages, known from the last request's mapping: of
    the messages it repeats, and of the reply stored after them when the request repeats that
    too (a client resending its history sends last turn's request, the reply, then new ones)."""
    if previous is None or not previous.path:
        return []
    limit = min(len(request.hashes), len(previous.path))
    count = 0
    while count < limit and request.hashes[count] == previous.hashes[count]:
        count += 1
    path = list(previous.path[:count])
    if (
        count == len(previous.path) < len(request.hashes)
        and previous.reply is not None
        and request.hashes[count] == previous.reply[0]
    ):
        path.append(previous.reply[1])
    return path


def scoped_id(name: str, fingerprint: str) -> str:
    """The id a client key's conversation called ``name`` is stored under when ``name`` itself
    is taken by another key (or by the library): the name (cut to leave room) and a digest of
    the key's fingerprint and the whole name. Only that key's requests ever compute it, and the
    fingerprint is never shown to a client, so no other key can take it first."""
    digest = hashlib.sha256(SCOPE_SALT + f"{fingerprint}\n{name}".encode()).hexdigest()
    head = name[: MAX_ID_CHARS - len(SCOPE_MARK) - SCOPE_DIGEST_CHARS]
    return f"{head}{SCOPE_MARK}{digest[:SCOPE_DIGEST_CHARS]}"


def resolve(engine: Engine, name: str, fingerprint: str) -> Resolved:
    """The conversation ``name`` means for the key of ``fingerprint``, read without a lock or a
    write (one primary-key read of at most two rows). Conversation ids are scoped per key: the
    name itself when this key owns it (every conversation a key created before keeps being
    found), else the key's scoped id (``scoped_id``) when that exists; for a new conversation,
    the name when no conversation holds it, else the scoped id. Another key's conversation is
    never named, so its existence is never told. A scoped id held by another key (only a key
    that knows this one's fingerprint could make one) is a ``NotFoundError``."""
    scoped = scoped_id(name, fingerprint)
    c = CONVERSATIONS.c
    with engine.connect() as connection:
        owners = dict(
            connection.execute(select(c.id, c.owner).where(c.id.in_([name, scoped]))).all()
        )
    if name in owners and store.is_owner(owners[name], fingerprint):
        return Resolved(name, True)
    if scoped in owners:
        if not store.is_owner(owners[scoped], fingerprint):
            raise NotFoundError(f"unknown conversation {name!r}")
        return Resolved(scoped, True)
    return Resolved(scoped if name in owners else name, False)


def store_request(
    engine: Engine,
    ingest: Ingest,
    conversation_id: str,
    owner: Owner,
    messages: Sequence[Mapping[str, Any]],
    seen: SeenRequests | None = None,
) -> Mapped:
    """Map ``messages`` onto the conversation (created for ``owner`` when new): the longest
    stored prefix is reused, the rest appended after it. A conversation of another owner is a
    ``NotFoundError``, as if it did not exist. The messages are checked first (an
    ``InputError`` before anything is written); with ``seen``, only past what the
    conversation's last request already held, and the ids that request (and the reply stored
    after it) were stored with are taken from memory: only the messages past them are looked
    up, and a request stored whole already touches the database not at all."""
    key = (owner.fingerprint, conversation_id)
    previous = seen.get(key) if seen is not None else None
    request = checked_and_hashed(messages, previous)
    known = known_path(request, previous)
    if seen is not None and known and len(known) == len(request.hashes):
        # all stored already, by this process's last turn: nothing to read or write (the
        # reply's store touches the conversation; a deleted one fails its assembly)
        same = previous is not None and tuple(known) == previous.path
        reply = previous.reply if same and previous is not None else None
        seen.put(key, replace(request, path=tuple(known), reply=reply))
        return Mapped(known[-1], len(known), [], tuple(known))
    for attempt in range(CREATE_ATTEMPTS):
        try:
            with session_scope(engine) as session:
                conversation = _claim(session, conversation_id, owner)
                mapped = _append(
                    session, conversation, ingest, request.checked, request.hashes, known
                )
            if seen is not None:
                seen.put(key, replace(request, path=mapped.path))
            return mapped
        except IntegrityError:  # created by another process between our read and insert
            if attempt + 1 == CREATE_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def store_after(
    engine: Engine,
    ingest: Ingest,
    conversation_id: str,
    owner: Owner,
    parent_id: int,
    messages: Sequence[Any],
) -> Mapped:
    """Append ``messages`` after the stored message ``parent_id``: a client that names where
    it continues (the Responses API's ``previous_response_id``) sends only its new messages.
    What is stored after the parent already (a retried request) is reused; tool results may
    answer the parent's calls. A parent not in the conversation is a ``NotFoundError``."""
    checked = [check_message(m, f"input[{i}]") for i, m in enumerate(messages)]
    hashes = [message_hash(m) for m in checked]
    with session_scope(engine) as session:
        conversation = _claim(session, conversation_id, owner)
        m = MESSAGES.c
        row = (
            session.connection()
            .execute(
                select(m.role, m.tool_calls, m.content_hash).where(
                    and_(m.conversation_id == conversation_id, m.id == parent_id)
                )
            )
            .first()
        )
        if row is None:
            raise NotFoundError(f"no message {parent_id} in conversation {conversation_id!r}")
        parent = {"role": row[0], "tool_calls": row[1] or None}
        return _append(
            session, conversation, ingest, [parent, *checked], [row[2] or "", *hashes], [parent_id]
        )


def stored_prefix(
    engine: Engine, conversation_id: str, fingerprint: str, messages: Sequence[Any]
) -> tuple[int | None, int]:
    """Where a history would land, writing nothing: the last stored message of its longest
    stored prefix (None when it repeats nothing, or the conversation is not this key's) and
    how many of its messages that prefix holds."""
    checked = [check_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    hashes = [message_hash(m) for m in checked]
    with session_scope(engine) as session:
        if not store.owned_by(session.connection(), conversation_id, fingerprint):
            return None, 0
        starts = _start_parents(session, conversation_id)
        bridges = attachments.marker_bridges(session.connection(), conversation_id)
        candidates = _candidates(session, conversation_id, hashes)
        path = longest_stored_prefix(candidates, hashes, starts, bridges)
    if path:  # the attachments made after the last message it repeats stay on the branch
        return bridges.get(path[-1], path[-1]), len(path)
    return None, 0


def store_reply(
    engine: Engine,
    ingest: Ingest,
    conversation_id: str,
    owner: Owner,
    leaf_id: int | None,
    reply: Mapping[str, Any],
    seen: SeenRequests | None = None,
) -> int:
    """Store the model's reply after ``leaf_id``; the same reply stored there already is reused
    (a retried request stores nothing twice), a different one starts a branch."""
    checked = check_message(reply, "reply")
    digest = message_hash(checked)
    reply_id = _store_reply(engine, ingest, conversation_id, owner, leaf_id, checked, digest)
    if seen is not None:
        seen.record_reply((owner.fingerprint, conversation_id), leaf_id, (digest, reply_id))
    return reply_id


def _store_reply(
    engine: Engine,
    ingest: Ingest,
    conversation_id: str,
    owner: Owner,
    leaf_id: int | None,
    checked: dict[str, Any],
    digest: str,
) -> int:
    with session_scope(engine) as session:
        conversation = _claim(session, conversation_id, owner)
        m = MESSAGES.c
        parent = m.parent_id.is_(None) if leaf_id is None else m.parent_id == leaf_id
        same = (
            session.connection()
            .execute(
                select(m.id).where(
                    and_(m.conversation_id == conversation_id, parent, m.content_hash == digest)
                )
            )
            .first()
        )
        if same is not None:
            return int(same[0])
        values = store.prepared_values(checked, conversation.model, ingest)
        return store.insert_chain(session, conversation.id, [values], leaf_id, touch=False)[0]


@dataclass(frozen=True, slots=True)
class Claimed:
    """The conversation a write holds the append lock of: its id and model."""

    id: str
    model: str


def _claim(session: Session, conversation_id: str, owner: Owner) -> Claimed:
    """The conversation under the append lock every writer takes, its activity touched and its
    model and owner read in the same statement (``store.touch_conversation``); created when new
    (insert-or-get, so two processes' first turns meet one row); another owner's is hidden."""
    found = store.touch_conversation(session, conversation_id)
    if found is None:
        conversation, created = store.ensure_conversation(
            session,
            conversation_id,
            owner.model,
            owner.max_input_tokens,
            owner=owner.fingerprint,
        )
        if created:
            return Claimed(conversation.id, conversation.model)
        found = store.touch_conversation(session, conversation_id)  # made by another meanwhile
    if found is None or not store.is_owner(found[1], owner.fingerprint):
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    return Claimed(conversation_id, found[0])


def _append(
    session: Session,
    conversation: Claimed,
    ingest: Ingest,
    messages: Sequence[Mapping[str, Any]],
    hashes: Sequence[str],
    known: Sequence[int] = (),
) -> Mapped:
    """The request on the tree: its longest stored prefix (the walk starts after ``known``,
    the ids of its first messages, when the last of them is still stored), the rest appended."""
    rest = hashes[len(known) :]
    nodes = _candidates(session, conversation.id, rest, known[-1]) if known else None
    bridges = attachments.marker_bridges(session.connection(), conversation.id)
    starts: list[int | None]
    if nodes is not None and any(node[0] == known[-1] for node in nodes):  # still stored
        starts = [known[-1]]
        wanted = set(rest)
        found = longest_stored_prefix([n for n in nodes if n[2] in wanted], rest, starts, bridges)
        path = [*known, *found]
    else:
        starts = _start_parents(session, conversation.id)
        candidates = _candidates(session, conversation.id, hashes)
        path = longest_stored_prefix(candidates, hashes, starts, bridges)
    new = messages[len(path) :]
    if not new:
        leaf = bridges.get(path[-1], path[-1]) if path else None
        return Mapped(leaf, len(path), [], tuple(path))
    check_tool_pairing(new, "messages", open_calls=open_calls(messages[: len(path)]))
    parent = path[-1] if path else max((s for s in starts if s is not None), default=None)
    if parent is not None:  # after the attachments made since: the client never sends them
        parent = bridges.get(parent, parent)
    rows = [store.prepared_values(dict(m), conversation.model, ingest) for m in new]
    ids = store.insert_chain(session, conversation.id, rows, parent, touch=False)  # claimed
    return Mapped(ids[-1], len(path), ids, (*path, *ids))


_M = MESSAGES.c
# built once: a request's reads on the serve path run per turn, and building a statement costs
# more than running one of these on an indexed table
_START_PARENTS = select(_M.id).where(
    _M.conversation_id == bindparam("cid"), _M.parent_id.is_(None), _M.role.in_(SYSTEM_ROLES)
)
_BY_HASH = select(_M.id, _M.parent_id, _M.content_hash).where(
    _M.conversation_id == bindparam("cid"),
    _M.content_hash.in_(bindparam("hashes", expanding=True)),
)
_BY_HASH_OR_ID = select(_M.id, _M.parent_id, _M.content_hash).where(
    _M.conversation_id == bindparam("cid"),
    or_(_M.content_hash.in_(bindparam("hashes", expanding=True)), _M.id == bindparam("known")),
)


def _start_parents(session: Session, conversation_id: str) -> list[int | None]:
    """Where a history may begin: as a root, or under a stored root system prompt (a request
    sends its own system prompt, which is not stored as history)."""
    rows = session.connection().execute(_START_PARENTS, {"cid": conversation_id})
    return [None, *sorted(int(row[0]) for row in rows)]


def _candidates(
    session: Session, conversation_id: str, hashes: Sequence[str], known: int | None = None
) -> list[Node]:
    """The stored messages whose hash is one of the request's: ids, parents and hashes only;
    with ``known``, that message too when it is still stored (read in the same query)."""
    unique = sorted(set(hashes))
    nodes: list[Node] = []
    connection = session.connection()
    for start in range(0, max(len(unique), known is not None), HASH_BATCH):
        batch = unique[start : start + HASH_BATCH]
        values: dict[str, Any] = {"cid": conversation_id, "hashes": batch}
        statement = _BY_HASH
        if known is not None and start == 0:
            statement, values["known"] = _BY_HASH_OR_ID, known
        nodes.extend((int(r[0]), r[1], r[2]) for r in connection.execute(statement, values))
    return nodes


def forget_response(engine: Engine, conversation_id: str, reply_id: int, owner: str) -> None:
    """``DELETE /v1/responses/{id}``: the stored reply's response is marked deleted (its id then
    names nothing: ``responses.reply_to_continue``); its messages stay in the history. A
    ``NotFoundError`` for another owner's conversation or a response deleted already."""
    from recap.core.storage.models import Conversation
    from recap.core.storage.responses import DELETED_RESPONSES

    with engine.connect() as connection:  # ownership first, before any lock
        if not store.owned_by(connection, conversation_id, owner):
            raise NotFoundError(conversation_id)
    with session_scope(engine) as session:
        if not store.lock_conversation(session, conversation_id, exclusive=True):
            raise NotFoundError(conversation_id)
        conversation = session.get(Conversation, conversation_id)
        assert conversation is not None, "the conversation is locked"
        meta = dict(conversation.meta or {})
        deleted = [int(v) for v in meta.get(DELETED_RESPONSES) or () if isinstance(v, int)]
        if reply_id in deleted:
            raise NotFoundError(conversation_id)
        meta[DELETED_RESPONSES] = sorted([*deleted, reply_id])
        conversation.meta = meta
        session.add(conversation)
