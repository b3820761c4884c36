"""The embedded file broker (kombu's filesystem transport, as Recap configures it): a message is
never seen half written, so concurrent producers and consumers lose none (kombu issue #1551)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from kombu import Connection

from recap.workers import filebroker

MESSAGES = 200
PAD = "x" * 400_000  # a large message: writing it takes long enough for a consumer to look


def _connection(folder: Path) -> Connection:
    filebroker.private_messages()
    queue = folder / "queue"
    queue.mkdir(parents=True, exist_ok=True)
    options = {"data_folder_in": str(queue), "data_folder_out": str(queue)}
    return Connection("filesystem://", transport_options=options)


def test_concurrent_producers_and_a_consumer_lose_no_message(tmp_path: Path) -> None:
    """Two threads publish while two consume through the real transport: every message
    arrives whole, once (before the fix a consumer could take a file created but not yet
    written, fail to decode it and drop it)."""
    received: list[int] = []
    errors: list[BaseException] = []

    def produce(start: int) -> None:
        with _connection(tmp_path) as connection:
            queue = connection.SimpleQueue("race")
            for number in range(start, MESSAGES, 2):
                queue.put({"n": number, "pad": PAD})
            queue.close()

    def consume() -> None:
        try:
            with _connection(tmp_path) as connection:
                queue = connection.SimpleQueue("race")
                while len(received) < MESSAGES:
                    try:
                        message = queue.get(timeout=2)
                    except queue.Empty:
                        continue
                    received.append(int(message.payload["n"]))
                    message.ack()
                queue.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=consume) for _ in range(2)]
    threads += [threading.Thread(target=produce, args=(start,)) for start in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(received) == list(range(MESSAGES))


def test_a_message_is_written_whole_private_and_under_its_final_name(tmp_path: Path) -> None:
    """One put leaves one ``.msg`` file, 0600, holding the whole JSON, and no partial file."""
    with _connection(tmp_path) as connection:
        queue = connection.SimpleQueue("one")
        queue.put({"hello": "world"})
        queue.close()
    names = sorted(os.listdir(tmp_path / "queue"))
    messages = [name for name in names if name.endswith(".one.msg")]
    assert len(messages) == 1
    assert not [name for name in names if name.startswith(filebroker.PARTIAL_PREFIX)]
    path = tmp_path / "queue" / messages[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["body"]


def test_concurrent_bindings_keep_every_queue_and_never_show_a_torn_table(tmp_path: Path) -> None:
    """Channels of separate processes bind queues to one exchange while others read its table
    (as a worker and a host's first enqueue do when they start together): every read decodes,
    and every binding is in the table at the end (kombu empties the file before writing it,
    so a reader could fail to decode it and a second binder could wipe the first's entry)."""
    bound = 24
    failures: list[BaseException] = []
    with _connection(tmp_path) as connection:
        channel = connection.default_channel
        stop = threading.Event()

        def bind(number: int) -> None:
            try:
                channel._queue_bind("shared", f"key{number}", "", f"queue{number}")
            except BaseException as exc:
                failures.append(exc)

        def read() -> None:
            while not stop.is_set():
                try:
                    channel.get_table("shared")
                except BaseException as exc:
                    failures.append(exc)
                    return

        readers = [threading.Thread(target=read) for _ in range(2)]
        for reader in readers:
            reader.start()
        binders = [threading.Thread(target=bind, args=(number,)) for number in range(bound)]
        for binder in binders:
            binder.start()
        for binder in binders:
            binder.join(timeout=60)
        stop.set()
        for reader in readers:
            reader.join(timeout=60)
        table = channel.get_table("shared")
    assert failures == []
    assert sorted(entry.queue for entry in table) == sorted(f"queue{n}" for n in range(bound))


def test_a_host_sends_to_the_broker_folder_it_is_configured_with_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sending app was cached by the broker URL alone, and the file broker's URL is always
    ``filesystem://``: once a process had sent through one folder, a host configured with
    another folder went on writing to the first one, where no worker of its looks (the suite
    lost a run this way when an earlier test had sent through a folder of its own)."""
    from recap.core.settings import get_settings
    from recap.workers import enqueue

    enqueue.reset()
    monkeypatch.setenv("RECAP_BROKER_URL", "filesystem://")
    try:
        for name in ("first", "second"):
            monkeypatch.setenv("RECAP_BROKER_FOLDER", str(tmp_path / name))
            get_settings.cache_clear()
            enqueue.compress_later(f"conversation-{name}")
        for name in ("first", "second"):
            queued = [p for p in (tmp_path / name / "queue").iterdir() if p.suffix == ".msg"]
            bodies = [p.read_text() for p in queued]
            assert len(bodies) == 1 and f"conversation-{name}" in bodies[0], name
    finally:
        enqueue.reset()
        get_settings.cache_clear()
