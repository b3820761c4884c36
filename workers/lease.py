"""Single flight for the workers: the lease lives with the other writes, in
``core.storage.lease``; this module names it where the workers (and their tests) look for it."""

from __future__ import annotations

from core.storage.lease import (
    ACQUIRE_TRIES,
    Lease,
    acquire,
    is_free,
    mark_dirty,
    new_owner,
    release,
    release_on,
    take,
)

__all__ = [
    "ACQUIRE_TRIES",
    "Lease",
    "acquire",
    "is_free",
    "mark_dirty",
    "new_owner",
    "release",
    "release_on",
    "take",
]
