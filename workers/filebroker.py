"""The embedded file broker's messages are private to the user, like the rest of ``.recap/``.

kombu's file transport writes each message with a plain ``open(name, "wb")``, so its mode is the
umask's (0644 as a rule), and a message taken from the queue is moved to the system's temporary
folder before it is read, where a 0700 queue folder no longer shields it. ``private_messages``
gives that module an ``open`` whose new files are 0600 (the mode survives the move); reads and
files that exist already are opened as before.
"""

from __future__ import annotations

import builtins
from typing import Any

from core.storage.private import private_opener

PATCHED_FLAG = "_recap_private_open"


def _private_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    if any(flag in mode for flag in "wxa+") and "opener" not in kwargs and len(args) < 6:
        kwargs["opener"] = private_opener
    return builtins.open(file, mode, *args, **kwargs)


setattr(_private_open, PATCHED_FLAG, True)


def private_messages() -> bool:
    """Make the file transport create its messages 0600 (idempotent); False without it."""
    try:
        from kombu.transport import filesystem
    except ImportError:  # pragma: no cover - kombu always ships it
        return False
    if not getattr(getattr(filesystem, "open", None), PATCHED_FLAG, False):
        filesystem.open = _private_open  # type: ignore[attr-defined]
    return True
