"""A user's memory as plain values: one stored entry (``MemoryRec``) and one change the
extraction model asks for (``MemoryEdit``), with the limits every door checks them against."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from recap.core.errors import InputError

MAX_KEY_CHARS = 64  # a key names a fact ("units", "name"), it does not hold it
MAX_TEXT_CHARS = 2_000  # one fact; the user's token cap bounds them all together
MAX_USER_CHARS = 255  # as a conversation id
KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
MEMORY_ENCODING = "o200k_base"  # a stored entry's tokens (the cap); a request counts its own
SET, DELETE = "set", "delete"
SERVE_PREFIX = "key-"  # a serve user id: the key's fingerprint, then the client's name


class MemoryRec(NamedTuple):
    """One stored entry of a user's memory: its key and text, what it costs, how often it was
    written (``uses``), when, and the conversation and message that last wrote it (None for an
    entry set by hand). A named tuple, like ``Msg``: every request of a user builds one per
    entry."""

    key: str
    text: str
    tokens: int
    uses: int = 1
    updated_at: datetime | None = None
    created_at: datetime | None = None
    conversation_id: str | None = None
    message_id: int | None = None

    def as_dict(self) -> dict[str, object]:
        """The entry as the CLI, the export and the console show it."""
        return {
            "key": self.key,
            "text": self.text,
            "tokens": self.tokens,
            "uses": self.uses,
            "conversation_id": self.conversation_id,
            "message_id": self.message_id,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }


@dataclass(frozen=True, slots=True)
class MemoryEdit:
    """One change to a user's memory: ``set`` a key to a text, or ``delete`` it."""

    op: str
    key: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.op not in (SET, DELETE):
            raise InputError(f"a memory edit is {SET!r} or {DELETE!r}, not {self.op!r}")
        object.__setattr__(self, "key", check_key(self.key))
        if self.op == SET:
            object.__setattr__(self, "text", check_text(self.text))


def check_key(key: object) -> str:
    """A memory key as stored: lower case letters, digits and ``_ . -``, at most 64 characters
    (a key is a name; anything else is refused, never rewritten into another key)."""
    if not isinstance(key, str):
        raise InputError("a memory key must be a string")
    key = key.strip().lower()
    if not key or len(key) > MAX_KEY_CHARS or not KEY_PATTERN.match(key):
        raise InputError(
            f"a memory key is 1-{MAX_KEY_CHARS} characters of a-z, 0-9, '_', '.' and '-' "
            f"(starting with a letter or digit), got {key[:80]!r}"
        )
    return key


def check_text(text: object) -> str:
    """A memory's text: non-empty, one fact of at most 2,000 characters, no NUL."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("a memory's text must be a non-empty string")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"a memory's text is at most {MAX_TEXT_CHARS} characters")
    if "\x00" in text:
        raise InputError("a memory's text may not hold a NUL character")
    return text.strip()


def check_user(user_id: object) -> str:
    """A user id: a non-empty string of at most 255 characters, no control characters."""
    if not isinstance(user_id, str) or not user_id.strip():
        raise InputError("a user id must be a non-empty string")
    if len(user_id) > MAX_USER_CHARS or any(ord(c) < 32 for c in user_id):
        raise InputError(f"a user id is at most {MAX_USER_CHARS} printable characters")
    return user_id


def serve_user(fingerprint: str, name: str) -> str:
    """The stored user id of the user a `recap serve` client key names ``name``: scoped by the
    key's fingerprint as conversation ids are, so one key never reads another key's users."""
    return check_user(f"{SERVE_PREFIX}{fingerprint[:16]}/{check_user(name)}")
