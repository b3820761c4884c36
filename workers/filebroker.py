"""The embedded file broker's messages are private to the user, like the rest of ``.recap/``, and
never read half written.

kombu's file transport writes each message with a plain ``open(name, "wb")``, so its mode is the
umask's (0644 as a rule), and a message taken from the queue is moved to the system's temporary
folder before it is read, where a 0700 queue folder no longer shields it. ``private_messages``
gives that module an ``open`` whose new files are 0600 (the mode survives the move); reads and
files that exist already are opened as before.

It also creates the message file under its final name and writes it after: a consumer that lists
the folder in between moves and reads an empty file, fails to decode it and loses the message
(kombu issue #1551, open). ``private_messages`` replaces the channel's ``_put`` with one that
writes the message under a name the consumers skip (it does not end in ``.msg``), then renames
it into place: a rename within one folder is atomic, so a message is seen whole or not at all.
"""

from __future__ import annotations

import builtins
import os
import uuid
from time import monotonic
from typing import Any

from core.storage.private import private_opener

PATCHED_FLAG = "_recap_private_open"
PARTIAL_PREFIX = ".partial-"  # a message being written: no consumer takes a name without .msg


def _private_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    if any(flag in mode for flag in "wxa+") and "opener" not in kwargs and len(args) < 6:
        kwargs["opener"] = private_opener
    return builtins.open(file, mode, *args, **kwargs)


setattr(_private_open, PATCHED_FLAG, True)


def _whole_put(self: Any, queue: str, payload: Any, **kwargs: Any) -> None:
    """The file transport's ``_put``, written under a partial name and renamed into place."""
    from kombu.exceptions import ChannelError
    from kombu.utils.encoding import str_to_bytes
    from kombu.utils.json import dumps

    name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
    final = os.path.join(self.data_folder_out, name)
    partial = os.path.join(self.data_folder_out, PARTIAL_PREFIX + uuid.uuid4().hex)
    try:
        with _private_open(partial, "wb", buffering=0) as file:
            file.write(str_to_bytes(dumps(payload)))  # type: ignore[no-untyped-call]
        os.replace(partial, final)
    except OSError as exc:
        raise ChannelError(f"Cannot add file {final!r} to directory") from exc


setattr(_whole_put, PATCHED_FLAG, True)


def private_messages() -> bool:
    """Make the file transport create its messages 0600 and write each whole before it can be
    taken (idempotent); False without it."""
    try:
        from kombu.transport import filesystem
    except ImportError:  # pragma: no cover - kombu always ships it
        return False
    if not getattr(getattr(filesystem, "open", None), PATCHED_FLAG, False):
        filesystem.open = _private_open  # type: ignore[attr-defined]
    if not getattr(filesystem.Channel._put, PATCHED_FLAG, False):
        filesystem.Channel._put = _whole_put  # type: ignore[method-assign]
    return True
