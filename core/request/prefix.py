"""Mapping a resent history onto the stored tree (pure).

A client sends its whole history every turn. The stored tree already holds most of it: the
longest stored path that the request repeats, message by message (compared by content hash), is
reused, and only the messages after it are appended there. An edited or regenerated message
differs in hash from the stored one, so the path ends before it and the edit starts a branch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from recap.core.values.records import SYSTEM_ROLES

Node = tuple[int, int | None, str | None]
"""A stored message as the lookup reads it: its id, its parent and its content hash."""


def longest_stored_prefix(
    nodes: Iterable[Node],
    hashes: Sequence[str],
    starts: Collection[int | None],
    bridges: Mapping[int, int] | None = None,
) -> list[int]:
    """Ids of the longest stored path whose hashes are ``hashes[:k]``, first message first.

    The path begins under one of ``starts`` (``None`` for a root). Where two stored paths repeat
    the request equally far (a message stored twice, by an explicit branch), the newest wins.
    ``bridges`` (``chain_ends``) maps a message to the last attachment marker stored after it:
    a client never sends Recap's markers, so the walk goes on under that marker too, and the
    path holds the client's messages only.
    """
    bridges = bridges or {}
    back = {end: start for start, end in bridges.items()}
    children: dict[tuple[int | None, str | None], list[int]] = {}
    parents: dict[int, int | None] = {}
    for node_id, parent, digest in nodes:
        children.setdefault((parent, digest), []).append(node_id)
        parents[node_id] = parent
    frontier = _bridged(dict.fromkeys(starts), bridges)
    matched: list[int] = []
    depth = 0
    for digest in hashes:
        found = [child for parent in frontier for child in children.get((parent, digest), ())]
        if not found:
            break
        matched, frontier, depth = found, _bridged(found, bridges), depth + 1
    if not matched:
        return []
    path = [max(matched)]
    while len(path) < depth:
        parent = parents[path[-1]]
        assert parent is not None, "a matched message below the first has a parent"
        path.append(back.get(parent, parent))
    return path[::-1]


def chain_ends(markers: Iterable[tuple[int, int, int | None]]) -> dict[int, int]:
    """From ``(open marker, close marker, the open marker's parent)`` of a conversation's
    attachments: each message some markers follow (not a marker itself) -> the last close
    marker of the chain after it (an attachment made after another follows the other's close
    marker)."""
    rows = list(markers)
    after = {parent: close for _, close, parent in rows if parent is not None}
    closes = {close for _, close, _ in rows}
    ends: dict[int, int] = {}
    for start, end in after.items():
        if start in closes:  # inside a chain: the chain is entered from its first message
            continue
        seen = {start}
        while end in after and end not in seen:
            seen.add(end)
            end = after[end]
        ends[start] = end
    return ends


def _bridged(ids: Iterable[int | None], bridges: Mapping[int, int]) -> list[int | None]:
    out = list(ids)
    return out + [bridges[i] for i in out if i is not None and i in bridges]


def split_system(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[str | None, list[Mapping[str, Any]]]:
    """The request's leading system (or developer) messages as one prompt, and the history."""
    count = 0
    while count < len(messages) and messages[count].get("role") in SYSTEM_ROLES:
        count += 1
    texts = [_text(m.get("content")) for m in messages[:count]]
    prompt = "\n\n".join(t for t in texts if t) or None
    return prompt, list(messages[count:])


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def open_calls(messages: Iterable[Mapping[str, Any]]) -> set[str]:
    """The tool calls the messages make and do not answer."""
    pending: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or ():
            pending.add(str(call.get("id", "")))
        if message.get("role") == "tool":
            pending.discard(str(message.get("tool_call_id")))
    return pending
