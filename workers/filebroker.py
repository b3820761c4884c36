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

The exchange tables (which queue a routing key reaches, one ``.exchange`` file each in the control
folder) have the same flaw: a binding creates the file with ``open(name, "wb")``, which empties it,
and writes after, so a publisher that reads the table in between fails to decode it (or a second
process binding at once empties the first one's table); several processes starting together, a
worker and the host's first enqueue, meet it (seen in treeverse/dvc-task#73). Every change of a
table is made here under an exclusive lock on a file of its own beside it, written whole under a
partial name and renamed into place, so a reader always sees a whole table. Within one process,
kombu marks a binding as made (in state shared by every connection) before it writes the table,
so a second thread that publishes at that moment finds no queue and the message is dropped
without a word; here the mark and the write happen under one lock.
"""

from __future__ import annotations

import builtins
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Any

from recap.core.storage.private import private_opener

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


@contextmanager
def _table_lock(self: Any, exchange: str) -> Iterator[Any]:
    """Hold the exchange's table lock (a file beside the table, never renamed) and give the
    table's path."""
    from kombu.transport.filesystem import LOCK_EX, lock, unlock

    file = self._exchange_file(exchange)
    self.control_folder.mkdir(exist_ok=True)
    with _private_open(f"{file}.lock", "ab") as guard:
        lock(guard, LOCK_EX)  # type: ignore[no-untyped-call]
        try:
            yield file
        finally:
            unlock(guard)  # type: ignore[no-untyped-call]


def _edit_table(self: Any, exchange: str, change: Callable[[list[Any]], list[Any]]) -> None:
    """Apply ``change`` to the exchange's table under its lock, writing the result whole."""
    from kombu.exceptions import ChannelError
    from kombu.utils.encoding import str_to_bytes
    from kombu.utils.json import dumps

    try:
        with _table_lock(self, exchange) as file:
            before = _read_table(file)
            after = change(list(before))
            if after == before and file.exists():
                return
            partial = file.parent / (PARTIAL_PREFIX + uuid.uuid4().hex)
            with _private_open(partial, "wb", buffering=0) as out:
                out.write(str_to_bytes(dumps(after)))  # type: ignore[no-untyped-call]
            os.replace(partial, file)
    except OSError as exc:
        raise ChannelError(f"Cannot change the table of exchange {exchange!r}") from exc


def _read_table(file: Any) -> list[Any]:
    """The table as stored: empty when it is missing, or left empty by a writer of kombu's own."""
    from kombu.transport.filesystem import exchange_queue_t
    from kombu.utils.encoding import bytes_to_str
    from kombu.utils.json import loads

    try:
        text = bytes_to_str(file.read_bytes())  # type: ignore[no-untyped-call]
    except FileNotFoundError:
        return []
    if not text.strip():
        return []
    return [exchange_queue_t(*entry) for entry in loads(text)]  # type: ignore[no-untyped-call]


def _queue_bind(self: Any, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
    """The file transport's ``_queue_bind``: the binding added to a table written whole."""
    from kombu.transport.filesystem import exchange_queue_t

    entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")
    _edit_table(self, exchange, lambda table: table if entry in table else [entry, *table])


def _delete(
    self: Any, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any
) -> None:
    """The file transport's ``_delete``: the binding removed from a table written whole."""
    from kombu.transport import virtual
    from kombu.transport.filesystem import exchange_queue_t

    virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)  # type: ignore[no-untyped-call]
    entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")
    if self._exchange_file(exchange).exists():
        _edit_table(self, exchange, lambda table: [each for each in table if each != entry])


def _get_table(self: Any, exchange: str) -> list[Any]:
    """The file transport's ``get_table``: a table is replaced whole, so no lock is taken."""
    from kombu.exceptions import ChannelError

    file = self._exchange_file(exchange)
    try:
        return _read_table(file)
    except OSError as exc:
        raise ChannelError(f"Cannot open {file}") from exc


_BINDING = threading.Lock()


def _locked_queue_bind(original: Callable[..., None]) -> Callable[..., None]:
    """kombu's ``queue_bind`` with the shared mark and the table's write under one lock."""

    def queue_bind(self: Any, *args: Any, **kwargs: Any) -> None:
        with _BINDING:
            original(self, *args, **kwargs)

    setattr(queue_bind, PATCHED_FLAG, True)
    return queue_bind


for _patched in (_queue_bind, _delete, _get_table):
    setattr(_patched, PATCHED_FLAG, True)


def private_messages() -> bool:
    """Make the file transport create its messages 0600 and write each whole before it can be
    taken (idempotent); False without it."""
    try:
        from kombu.transport import filesystem
    except ImportError:  # pragma: no cover - kombu always ships it
        return False
    if not getattr(getattr(filesystem, "open", None), PATCHED_FLAG, False):
        filesystem.open = _private_open  # type: ignore[attr-defined]
    channel = filesystem.Channel
    for name, patched in (
        ("_put", _whole_put),
        ("_queue_bind", _queue_bind),
        ("_delete", _delete),
        ("get_table", _get_table),
    ):
        if not getattr(getattr(channel, name), PATCHED_FLAG, False):
            setattr(channel, name, patched)
    if not getattr(channel.queue_bind, PATCHED_FLAG, False):
        channel.queue_bind = _locked_queue_bind(channel.queue_bind)  # type: ignore[method-assign]
    return True
