"""What `recap serve` keeps in memory across turns: a lock per conversation, held from the read
to the stored reply, and the stored conversation id of recently used (key, name) pairs."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Hashable

RESOLVED_NAMES = 1024  # (key, name) pairs whose stored conversation id is kept in memory


class ConversationLocks:
    """An asyncio lock per conversation (a key and a name), dropped when no request holds or
    awaits it."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._users: dict[Hashable, int] = {}

    async def settled(self, conversation_id: Hashable) -> None:
        """Wait until the turns of the conversation under way now have let it go (at once
        when none is); nothing is held afterwards."""
        if conversation_id in self._locks:
            await self.acquire(conversation_id)
            self.release(conversation_id)

    async def acquire(self, conversation_id: Hashable) -> None:
        lock = self._locks.setdefault(conversation_id, asyncio.Lock())
        self._users[conversation_id] = self._users.get(conversation_id, 0) + 1
        try:
            await lock.acquire()
        except BaseException:
            self._leave(conversation_id)
            raise

    def release(self, conversation_id: Hashable) -> None:
        self._locks[conversation_id].release()
        self._leave(conversation_id)

    def _leave(self, conversation_id: Hashable) -> None:
        self._users[conversation_id] -= 1
        if self._users[conversation_id] == 0:
            del self._users[conversation_id], self._locks[conversation_id]

    def __len__(self) -> int:
        return len(self._locks)


class ResolvedNames:
    """The stored conversation id of recently used (key fingerprint, name) pairs, so a turn
    finds its conversation without a read; the least recently used dropped past ``size``. Only
    ids a turn stored to are kept: an id that stops being this key's (deleted, then made by
    another key) fails the store, which drops it and resolves the name again."""

    def __init__(self, size: int = RESOLVED_NAMES) -> None:
        self.size = size
        self._ids: OrderedDict[tuple[str, str], str] = OrderedDict()

    def get(self, key: tuple[str, str]) -> str | None:
        found = self._ids.get(key)
        if found is not None:
            self._ids.move_to_end(key)
        return found

    def put(self, key: tuple[str, str], conversation_id: str) -> None:
        self._ids[key] = conversation_id
        self._ids.move_to_end(key)
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def drop(self, key: tuple[str, str]) -> None:
        self._ids.pop(key, None)
