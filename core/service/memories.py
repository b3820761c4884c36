"""A user's memory for the CLI and the console: each of these is one engine-level operation of
``core.storage.memories`` (it opens its own short session, checks the user id and the key, and
for a write holds the user's row): the entries, the user's switch, one entry set or deleted, the
users with entries, and the runs that wrote them. Named here so the doors never reach into the
storage layer; what a request sends is ``core.request.memory``, the extraction ``core.memory``."""

from __future__ import annotations

from recap.core.storage.memories import (
    delete_memory,
    is_enabled,
    list_memories,
    set_enabled,
    set_memory,
    users,
    written_by,
)

__all__ = [
    "delete_memory",
    "is_enabled",
    "list_memories",
    "set_enabled",
    "set_memory",
    "users",
    "written_by",
]
