"""Attach and merge for the host API and the CLI: ``attach`` puts an attach pointer on a
conversation's branch, ``merge`` attaches peer branches with an instruction and returns the
request to send (the reply, once added, commits the merge), ``expand_loaded`` expands the
attachments of a branch read for a request (``core.request.attach``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select

from recap.core.errors import InputError
from recap.core.request import assembly
from recap.core.request.attach import expand
from recap.core.storage import attachments, reads
from recap.core.storage.db import session_scope
from recap.core.storage.models import MESSAGES
from recap.core.values.attach import MERGE, Expansion

Peer = int | str  # a branch head of the same conversation, or another conversation (its head)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Attached:
    """An attachment made: its markers and the source branch it names."""

    conversation_id: str
    open_id: int
    close_id: int
    source: str
    leaf: int | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MergeStarted:
    """A merge waiting for its reply: the request to send, the instruction message the reply
    goes after, and the commit's parents-to-be (the previous head first, then each peer's)."""

    request: assembly.AssembledRequest | None
    merge_id: int
    instruction_id: int
    parents: list[int]
    attached: list[Attached]

    def as_dict(self) -> dict[str, Any]:
        return {
            "merge": self.merge_id,
            "instruction": self.instruction_id,
            "parents": self.parents,
            "attached": [a.as_dict() for a in self.attached],
        } | ({"request": self.request.as_dict()} if self.request is not None else {})


def attach(
    engine: Engine, conversation_id: str, source: str, *, leaf: int | None = None
) -> Attached:
    """Attach ``source``'s branch ending at ``leaf`` (default: its latest message) after the
    conversation's head. ``NotFoundError`` for an unknown conversation, source or leaf (another
    owner's source reads as unknown); ``InputError`` when the head waits for tool results."""
    with engine.connect() as connection:
        found = attachments.check_source(connection, conversation_id, source, leaf)
        if found.leaf is None:
            raise InputError(f"conversation {source!r} has no messages to attach")
        if attachments.attached_already(connection, conversation_id, source, found.leaf):
            raise InputError(f"{source!r} up to message {found.leaf} is attached already")
        _check_head(connection, conversation_id, None)
    with session_scope(engine) as session:
        pointers, _ = attachments.attach(session, conversation_id, [found])
    p = pointers[0]
    return Attached(
        conversation_id=conversation_id,
        open_id=p.open_id,
        close_id=p.close_id,
        source=p.source,
        leaf=p.leaf,
    )


def open_merge(
    engine: Engine,
    conversation_id: str,
    *,
    peers: Sequence[Peer],
    instruction: str,
    leaf: int | None = None,
) -> MergeStarted:
    """Attach each peer branch after ``leaf`` (default: the latest message), the first one
    locked (sent as stored until the merge commits), then the instruction, and record the merge
    (its request is assembled by ``core.service.assembling.merge``). Adding the reply after the
    instruction commits it."""
    if not peers:
        raise InputError("merge needs at least one peer")
    if not isinstance(instruction, str) or not instruction.strip():
        raise InputError("merge needs an instruction")
    with engine.connect() as connection:
        path = reads.branch_path(connection, conversation_id, leaf)
        head = path[-1] if path else None
        found = []
        for peer in peers:
            if isinstance(peer, bool) or not isinstance(peer, int | str):
                raise InputError(f"a peer is a message id or a conversation id, not {peer!r}")
            if isinstance(peer, int):
                if peer in path:
                    raise InputError(f"peer {peer} is on the branch it would merge into")
                found.append(
                    attachments.check_source(connection, conversation_id, conversation_id, peer)
                )
            else:
                found.append(attachments.check_source(connection, conversation_id, peer, None))
            if found[-1].leaf is None:
                raise InputError(f"conversation {peer!r} has no messages to merge")
            if found[-1].conversation_id == conversation_id and found[-1].leaf in path:
                raise InputError(f"peer {peer!r} is on the branch it would merge into")
        heads = [(f.conversation_id, f.leaf) for f in found]
        if len(set(heads)) < len(heads):
            raise InputError("a peer is named twice")
        _check_head(connection, conversation_id, head)
    instruction_message = {"role": "user", "content": instruction}
    with session_scope(engine) as session:
        pointers, (instruction_id,) = attachments.attach(
            session,
            conversation_id,
            found,
            kind=MERGE,
            lock_first=True,
            then=[instruction_message],
            parent_id=head,
        )
        connection = session.connection()
        peer_heads = [(f.conversation_id, f.leaf) for f in found]
        merge_id = attachments.open_merge(
            connection, conversation_id, head, instruction_id, peer_heads
        )
        attachments.set_merge(connection, [p.open_id for p in pointers], merge_id)
    parents = [*([head] if head is not None else []), *(f.leaf for f in found if f.leaf)]
    made = [
        Attached(
            conversation_id=conversation_id,
            open_id=p.open_id,
            close_id=p.close_id,
            source=p.source,
            leaf=p.leaf,
        )
        for p in pointers
    ]
    return MergeStarted(
        request=None,
        merge_id=merge_id,
        instruction_id=instruction_id,
        parents=parents,
        attached=made,
    )


def _check_head(connection: Connection, conversation_id: str, head: int | None) -> None:
    """An ``InputError`` when the message the markers would follow waits for tool results."""
    if attachments.open_calls_at(connection, conversation_id, head):
        raise InputError(
            "the branch head is an assistant message with tool calls: add their results first"
        )


def expand_loaded(
    connection: Connection, conversation_id: str, loaded: reads.RequestBranch
) -> tuple[reads.RequestBranch, Expansion | None]:
    """The branch read for a request with its attachments expanded; the locked items (a merge's
    base peer) pinned for this request, their clearings not applied."""
    pointers = attachments.pointers_of(connection, conversation_id)
    if not pointers:
        return loaded, None
    expansion = expand(
        loaded.branch, pointers, attachments.source_loader(connection, conversation_id)
    )
    if not expansion.blocks:
        return loaded, None
    clearings = loaded.clearings
    pinned = loaded.pinned
    if expansion.locked:
        clearings = {k: v for k, v in clearings.items() if k not in expansion.locked}
        held = {m.id for m in pinned} | expansion.locked
        pinned = [m for m in expansion.branch if m.id in held]
    return (
        dataclasses.replace(loaded, branch=expansion.branch, clearings=clearings, pinned=pinned),
        expansion,
    )


def merges(engine: Engine, conversation_id: str) -> list[attachments.MergeRow]:
    """The conversation's merges, oldest first (``NotFoundError`` for an unknown one)."""
    with engine.connect() as connection:
        reads.branch_path(connection, conversation_id, None)  # the conversation exists
        return attachments.merges_of(connection, conversation_id)


def commit_on_add(connection: Connection, conversation_id: str, ids: Sequence[int]) -> None:
    """After an append: when its first message replies to an open merge's instruction, that
    reply commits the merge (``core.storage.attachments.commit_merges``)."""
    if not ids:
        return
    parent = connection.execute(
        select(MESSAGES.c.parent_id).where(MESSAGES.c.id == ids[0])
    ).scalar()
    attachments.commit_merges(connection, conversation_id, parent, ids)
