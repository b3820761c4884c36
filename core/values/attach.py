"""What attach and merge hand around: an attach pointer as stored (``Pointer``), a source branch
as read for it (``Source``), and what expanding a branch gives (``Expansion``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from recap.core.values.records import Msg

ATTACH, MERGE = "attach", "merge"  # an attachment's kinds


class Pointer(NamedTuple):
    """One attachment on a branch: its open and close marker messages, the source conversation
    and the leaf its branch ends at (None: the source was empty when attached)."""

    open_id: int
    close_id: int
    source: str
    leaf: int | None
    kind: str = ATTACH
    locked: bool = False  # a merge's base peer: sent as stored while the merge is open
    incarnation: str | None = None  # the source's life when attached (another one is not it)


@dataclass(frozen=True, slots=True)
class Source:
    """A source branch as read: its messages root first (text included) and its own attach
    pointers, by open marker id (a source that attached others is expanded in turn)."""

    messages: list[Msg]
    pointers: Mapping[int, Pointer] = field(default_factory=dict)


# Reads the source branch a pointer names, or None when it cannot be loaded (erased, created
# again since, or another owner's).
SourceLoader = Callable[[Pointer], Source | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """One attachment as expanded into a request: where it came from, the ids of the items it
    brought (root first), and whether it fell back to the single unavailable item."""

    open_id: int
    close_id: int
    source: str
    leaf: int | None
    items: tuple[int, ...]
    fallback: bool = False
    locked: bool = False


@dataclass(frozen=True, slots=True)
class Expansion:
    """A branch with its attachments expanded: the messages to assemble from, each attached
    item's provenance (message id -> ``conversation:message``), the blocks, and the ids of
    locked items (sent as stored)."""

    branch: list[Msg]
    provenance: dict[int, str]
    blocks: tuple[Block, ...] = ()
    locked: frozenset[int] = frozenset()

    def spans(self) -> tuple[tuple[int, int], ...]:
        """Each expanded block's open and close marker ids (a fallback has no span)."""
        return tuple((b.open_id, b.close_id) for b in self.blocks if not b.fallback)
