"""Writers meeting each other: SQLite write transactions take the write lock as they begin and
wait for it (never "database is locked"), and concurrent first use of one conversation through
the API and the CLI creates it once and loses nothing (SQLite and PostgreSQL, threads and
processes; never a unique-key error)."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from recap.core import service
from recap.core.client import Recap
from recap.core.errors import InputError
from recap.core.settings import get_settings
from recap.core.storage import store
from recap.core.storage.db import session_scope
from recap.core.storage.models import CONVERSATIONS

WRITERS = 8  # `recap add` processes at once
ADDS = 15  # adds each in the long run
FAST_ADDS = 4  # adds each in the suite's run
BURNERS = 2  # busy loops keeping both cores loaded while the writers run
THREADS = 8
CHILD_TIMEOUT = 300
WRITERS_TIMEOUT = 1_200  # 120 interpreter starts on two busy cores: minutes, not seconds
FAST_TIMEOUT = 300
PAUSE = 0.02  # at most this many seconds before each add of the suite's run (seeded)
BURN_IN = 0.5  # seconds both cores are busy before the suite's writers are released


@contextmanager
def cpu_load(count: int = BURNERS) -> Iterator[None]:
    """Busy-loop processes this test starts and stops itself."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``recap`` command in a child process, on this test's settings."""
    return subprocess.run(
        [sys.executable, "-m", "recap.workers.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=CHILD_TIMEOUT,
        check=False,
    )


def writer_process(url: str, number: int, pauses: list[float], ready: Any, go: Any) -> None:
    """One writer of the suite's run, in a process of its own: ``recap add`` through the
    command's entry point once per pause, after every writer is ready; its exit code is the
    number of adds that failed (their one-line errors on its stderr)."""
    os.environ["RECAP_DATABASE_URL"] = url
    from recap.workers.cli import app

    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
        app(["export", "busy"])  # a read first: the command's engine is made before the race
    ready.wait()
    go.wait()
    failed = 0
    for n, pause in enumerate(pauses):
        time.sleep(pause)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the id it prints
                app(["add", "busy", "--role", "user", "--content", f"w{number} n{n}"])
        except SystemExit as done:
            failed += done.code not in (0, None)
    sys.exit(failed)


def eight_writer_processes(engine: Engine, adds: int, seed: int) -> None:
    """Eight writer processes on one conversation (forked from one that imported Recap, so the
    starts are cheap), released together once every one has read the conversation, both cores
    busy, each running ``adds`` adds with a seeded random pause (up to ``PAUSE`` s) before each:
    every add succeeds and lands on the branch once."""
    service.new_conversation(engine, get_settings(), "busy")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["recap.workers.cli", "recap.core.service", __name__])
    ready, go = context.Barrier(WRITERS + 1), context.Event()
    pauses = random.Random(seed)
    url = str(engine.url.render_as_string(hide_password=False))
    children = [
        context.Process(
            target=writer_process,
            args=(url, number, [pauses.uniform(0, PAUSE) for _ in range(adds)], ready, go),
        )
        for number in range(WRITERS)
    ]
    for child in children:
        child.start()
    try:
        ready.wait(timeout=CHILD_TIMEOUT)
        with cpu_load():
            time.sleep(BURN_IN)
            go.set()
            for child in children:
                child.join(timeout=CHILD_TIMEOUT)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()
    assert [child.exitcode for child in children] == [0] * WRITERS
    branch = service.export_conversation(engine, "busy")["messages"]
    texts = sorted(m["content"] for m in branch)
    assert texts == sorted(f"w{w} n{n}" for w in range(WRITERS) for n in range(adds))


@pytest.mark.timeout(FAST_TIMEOUT)
def test_eight_writer_processes_under_load_never_find_the_database_locked(
    sqlite_engine: Engine,
) -> None:
    """The suite's run: eight processes, four adds each through ``recap add``'s entry point in
    the process (forked, not 32 interpreter starts), released together, seeded pauses."""
    eight_writer_processes(sqlite_engine, FAST_ADDS, seed=36)


@pytest.mark.slow
@pytest.mark.timeout(WRITERS_TIMEOUT)
def test_eight_cli_writers_under_load_never_find_the_database_locked(
    sqlite_engine: Engine,
) -> None:
    """The long run (``-m slow``), as the issue reproduced the failure: eight writers, each
    running fifteen ``recap add`` processes one after the other on one conversation, both cores
    busy: every add succeeds and lands on the branch."""
    service.new_conversation(sqlite_engine, get_settings(), "busy")
    failures: list[str] = []

    def writer(number: int) -> None:
        for n in range(ADDS):
            done = cli("add", "busy", "--role", "user", "--content", f"w{number} n{n}")
            if done.returncode != 0:
                failures.append(done.stderr.strip())

    with cpu_load(), ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(writer, range(WRITERS)))
    assert failures == []
    branch = service.export_conversation(sqlite_engine, "busy")["messages"]
    texts = sorted(m["content"] for m in branch)
    assert texts == sorted(f"w{w} n{n}" for w in range(WRITERS) for n in range(ADDS))


def all_at_once(count: int, call: Callable[[int], Any]) -> list[Any]:
    """``call(i)`` for ``count`` threads released together; each result or raised error."""
    barrier = threading.Barrier(count)

    def run(index: int) -> Any:
        barrier.wait()
        try:
            return call(index)
        except Exception as exc:  # collected: the test names what escaped
            return exc

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def conversations_named(engine: Engine, cid: str) -> int:
    with session_scope(engine) as session:
        statement = select(func.count()).where(CONVERSATIONS.c.id == cid)
        return int(session.connection().execute(statement).scalar() or 0)


def test_threads_creating_one_conversation_create_it_once(engine: Engine) -> None:
    """Eight threads ``Recap.new`` one id at once: one creates it, the others are told it
    exists (an ``InputError``), and each then adds its message: none is lost."""
    client = Recap(get_settings(), engine)

    def first_use(index: int) -> int:
        try:
            client.new("shared")
        except InputError as exc:
            assert "already exists" in str(exc)
        return client.add("shared", {"role": "user", "content": f"thread {index}"})

    results = all_at_once(THREADS, first_use)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert conversations_named(engine, "shared") == 1
    branch = client.export("shared")["messages"]
    assert sorted(m["content"] for m in branch) == sorted(f"thread {i}" for i in range(THREADS))


def test_threads_ensuring_one_conversation_meet_one_row(engine: Engine) -> None:
    """``store.ensure_conversation`` (the insert-or-get ``recap serve`` uses) from eight threads
    at once: exactly one says it created the row, every one gets it."""

    def ensure(_: int) -> bool:
        with session_scope(engine) as session:
            conversation, created = store.ensure_conversation(session, "met", "gpt-4o-mini")
            assert conversation.id == "met" and conversation.incarnation
            return created

    results = all_at_once(THREADS, ensure)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert results.count(True) == 1
    assert conversations_named(engine, "met") == 1


def test_processes_importing_one_id_create_it_once(engine: Engine, tmp_path: Path) -> None:
    """Four ``recap import`` processes of one id at once: one imports it, the others each print
    one line saying it exists; no unique-key error escapes and one conversation is stored."""
    path = tmp_path / "one.jsonl"
    path.write_text('{"id": "dup", "messages": [{"role": "user", "content": "hello"}]}\n')
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: cli("import", str(path), "--json"), range(4)))
    assert sum(r.returncode == 0 for r in results) == 1, [r.stderr for r in results]
    for refused in (r for r in results if r.returncode != 0):
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "already exists" in lines[0], refused.stderr
        assert "IntegrityError" not in refused.stderr and "Traceback" not in refused.stderr
    assert conversations_named(engine, "dup") == 1
    assert len(service.export_conversation(engine, "dup")["messages"]) == 1


@pytest.mark.parametrize("count", [THREADS])
def test_imports_racing_a_new_conversation_are_refused_cleanly(engine: Engine, count: int) -> None:
    """Threads importing the same id through the API at once: one import, ``InputError`` for
    the rest."""
    settings = get_settings()

    def imported(index: int) -> Any:
        record = {"id": "race", "messages": [{"role": "user", "content": f"from {index}"}]}
        return service.import_conversations(engine, [record], settings)

    results = all_at_once(count, imported)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(e, InputError) and "already exists" in str(e) for e in errors), errors
    assert len(errors) == count - 1
    assert conversations_named(engine, "race") == 1
