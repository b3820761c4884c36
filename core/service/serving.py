"""``recap serve``'s operations on the store. Each is one engine-level operation of
``core.storage.requests`` or ``core.storage.responses`` that opens its own short transaction (a
write holds the conversation's append lock, the one ``Recap.add`` takes): where a client key's
conversation name is stored, a resent history mapped onto the stored branch (or the messages
after a named one) and the model's reply stored, where a history would land without writing,
what a response id names and a response deleted. ``SeenRequests`` is the process's memory of
each conversation's last request that the history mapping is given; the values these return are
in ``core.values.serving``. Named here so ``recap serve`` never reaches into the storage layer."""

from __future__ import annotations

from recap.core.storage.requests import (
    SeenRequests,
    forget_response,
    resolve,
    store_after,
    store_reply,
    store_request,
    stored_prefix,
)
from recap.core.storage.responses import reply_to_continue, stored_reply

__all__ = [
    "SeenRequests",
    "forget_response",
    "reply_to_continue",
    "resolve",
    "store_after",
    "store_reply",
    "store_request",
    "stored_prefix",
    "stored_reply",
]
