"""Attachments expanded into a branch (pure): the messages of each attached source branch
between its open and close markers, each once.

An attach pointer is two stored messages on the branch, its open and close markers
(``core.storage.attachments``). ``expand`` puts the source's messages between them, root first,
recording where each came from; an attachment whose source cannot be loaded (erased, created
again since, another owner's) is one user item saying so, the close marker dropped. Every item is
expanded at most once along a branch: the branch's own messages and the items of earlier
attachments are never brought in again (attaching a branch of the same conversation brings only
what it does not share, attaching a source again only what it gained since). A source's own
attachments are expanded in turn. Within a block, tool calls and results keep their pairs: a call
whose result the block does not bring is left out with its results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from recap.core.values.attach import Block, Expansion, Pointer, SourceLoader
from recap.core.values.records import SYSTEM_ROLES, Msg

MAX_DEPTH = 8  # attachments of attachments expanded at most this deep (then the fallback)


def open_text(source: str, leaf: int | None) -> str:
    """The open marker's text, stored when the source is attached."""
    upto = f" up to message {leaf}" if leaf is not None else ""
    return (
        f'[Attached: the messages of conversation "{source}"{upto} follow, until the '
        "end-of-attachment marker.]"
    )


def close_text(source: str) -> str:
    """The close marker's text."""
    return f'[End of the attachment from conversation "{source}".]'


def fallback_text(source: str) -> str:
    """The single item that stands in for an attachment whose source cannot be loaded."""
    return (
        f'[An attachment from conversation "{source}" stood here; that conversation is no '
        "longer available, so its messages are not included.]"
    )


def provenance_of(source: str, message_id: int) -> str:
    """How an item's provenance is written: ``conversation:message``."""
    return f"{source}:{message_id}"


def expand(branch: Sequence[Msg], pointers: Mapping[int, Pointer], load: SourceLoader) -> Expansion:
    """``branch`` with each attachment on it expanded (see the module). ``pointers`` are the
    branch's attach pointers by open marker id; ``load`` reads a source branch."""
    if not pointers or not any(m.id in pointers for m in branch):
        return Expansion(list(branch), {})
    state = _State(seen={m.id for m in branch}, load=load)
    out = state.walk(branch, pointers, depth=0)
    return Expansion(out, state.provenance, tuple(state.blocks), frozenset(state.locked))


class _State:
    """What one expansion has brought so far."""

    def __init__(self, seen: set[int], load: SourceLoader) -> None:
        self.seen = seen
        self.load = load
        self.provenance: dict[int, str] = {}
        self.blocks: list[Block] = []
        self.locked: set[int] = set()
        self.opened: set[int] = set()  # open markers expanded (their close markers stay)

    def walk(self, branch: Sequence[Msg], pointers: Mapping[int, Pointer], depth: int) -> list[Msg]:
        out: list[Msg] = []
        closes = {p.close_id: p for p in pointers.values()}
        skipped: set[int] = set()
        for message in branch:
            if message.id in skipped:
                continue
            pointer = pointers.get(message.id)
            if pointer is None:
                if message.id not in closes or closes[message.id].open_id in self.opened:
                    out.append(message)
                continue
            out.extend(self._block(message, pointer, depth, skipped))
        return out

    def _block(self, opener: Msg, pointer: Pointer, depth: int, skipped: set[int]) -> list[Msg]:
        source = self.load(pointer) if depth < MAX_DEPTH and pointer.leaf is not None else None
        if source is None:
            skipped.add(pointer.close_id)
            self.blocks.append(
                Block(
                    open_id=pointer.open_id,
                    close_id=pointer.close_id,
                    source=pointer.source,
                    leaf=pointer.leaf,
                    items=(),
                    fallback=True,
                )
            )
            return [opener._replace(content=fallback_text(pointer.source), content_parts=None)]
        self.opened.add(pointer.open_id)
        fresh = [m for m in source.messages if m.id not in self.seen and m.role not in SYSTEM_ROLES]
        self.seen.update(m.id for m in fresh)
        inner = self.walk(fresh, source.pointers, depth + 1)
        items = paired(inner)
        self.seen.difference_update({m.id for m in inner} - {m.id for m in items})
        for item in items:
            self.provenance.setdefault(item.id, provenance_of(pointer.source, item.id))
        ids = tuple(m.id for m in items)
        self.blocks.append(
            Block(
                open_id=pointer.open_id,
                close_id=pointer.close_id,
                source=pointer.source,
                leaf=pointer.leaf,
                items=ids,
                fallback=False,
                locked=pointer.locked,
            )
        )
        if pointer.locked:
            self.locked.update(ids)
        return [opener, *items]


def paired(items: Sequence[Msg]) -> list[Msg]:
    """``items`` with valid tool pairs: an assistant's calls kept only when the items hold a
    result for each after it, a result only after the call it answers."""
    later: dict[str, int] = {}
    for m in items:
        if m.role == "tool" and m.tool_call_id is not None:
            later[m.tool_call_id] = later.get(m.tool_call_id, 0) + 1
    kept: list[Msg] = []
    open_calls: dict[str, int] = {}
    pending = dict(later)
    for m in items:
        if m.role == "tool":
            call = m.tool_call_id
            if call is not None:
                pending[call] = pending.get(call, 0) - 1
            if call is not None and open_calls.get(call, 0) > 0:
                open_calls[call] -= 1
                kept.append(m)
            continue
        calls = m.tool_call_ids if m.role == "assistant" else ()
        if calls and not all(pending.get(c, 0) > 0 for c in calls):
            continue
        for c in calls:
            open_calls[c] = open_calls.get(c, 0) + 1
        kept.append(m)
    return kept


def outside_spans(
    ids: Sequence[int], spans: Sequence[tuple[int, int]], cutoff: int | None
) -> int | None:
    """The summary cutoff ``cutoff`` moved out of any attachment: a cutoff from an open marker
    up to the item before its close marker becomes the message before the open marker (None
    when there is none), so a summary covers an attachment whole or not at all."""
    if cutoff is None or not spans:
        return cutoff
    index = {mid: i for i, mid in enumerate(ids)}
    at = index.get(cutoff)
    if at is None:
        return cutoff
    for open_id, close_id in spans:
        start, end = index.get(open_id), index.get(close_id)
        if start is None or end is None:
            continue
        if start <= at < end:
            return ids[start - 1] if start > 0 else None
    return cutoff
