"""What the framework tests and the ``frameworks`` benchmark share: a ``recap worker`` on the file
broker over a SQLite database, the stand-in model server answering each agent turn, and how to
read what the worker did.

``FrameworkStack.start`` migrates the database and starts the worker (``recap worker --queues
compress``, the offline summarizer unless told otherwise); ``recap()`` is a host handle with the
same settings (the caller points ``RECAP_*`` at them first, see ``host_env``: the enqueue helper
reads the broker folder from the environment). ``runs(cid)`` counts the worker's finished tasks
of a conversation, so a test waits for the run its turn enqueued before the next turn.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from recap.core.client import Recap
from recap.core.settings import Settings, get_settings
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from tests.support.llm_server import LLMServer, Recorded, Reply
from tests.support.processes import wait_for
from tests.support.worker_stack import WorkerProcess, worker_env

RUN_TIMEOUT = 180.0  # seconds for the worker to finish a turn's run (room for a loaded machine)
SUMMARY_MARK = SUMMARY_MESSAGE_PREFIX.strip()[:30]
DONE_EVENT = '"event": "task_done"'  # the worker's log line for each finished task
REPLY_WORDS = 90  # about 120 tokens per reply
USER_WORDS = 70  # about 100 tokens per user message


def user_text(turn: int) -> str:
    """A user message of ``turn``: distinct words, so nothing compresses by repetition."""
    return f"turn {turn}: " + " ".join(f"u{turn}w{i}" for i in range(USER_WORDS))


@dataclass
class Replies:
    """The stand-in model's answer to an agent turn: numbered text of about 120 tokens."""

    count: itertools.count[int] = field(default_factory=itertools.count)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> str:
        with self.lock:
            n = next(self.count)
        return f"reply {n}: " + " ".join(f"r{n}w{i}" for i in range(REPLY_WORDS))


def tool_call_reply(call_id: str, name: str, arguments: str) -> Reply:
    """A scripted model answer calling one tool."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return Reply(text="", tool_calls=[call])


def carries_summary(request: Recorded) -> bool:
    return SUMMARY_MARK in request.text or any(
        SUMMARY_MARK in str(item.get("content") or "") for item in request.messages
    )


@dataclass
class FrameworkStack:
    folder: Path
    server: LLMServer
    worker: WorkerProcess | None = None
    summary_env: dict[str, str] = field(default_factory=dict)

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.folder / 'recap.db'}"

    def host_env(self) -> dict[str, str]:
        """The ``RECAP_*`` values of a host on this stack."""
        return {
            "RECAP_DATABASE_URL": self.database_url,
            "RECAP_BROKER_URL": "filesystem://",
            "RECAP_BROKER_FOLDER": str(self.folder / "broker"),
            "RECAP_OUTPUT_DIR": str(self.folder / "outputs"),
        }

    def settings(self) -> Settings:
        values = {k.removeprefix("RECAP_").lower(): v for k, v in self.host_env().items()}
        return Settings(**values)  # type: ignore[arg-type]  # validated from strings

    def start(self) -> FrameworkStack:
        Recap(self.settings(), create_schema=True).engine.dispose()
        env = worker_env(**self.host_env(), **self.summary_env)
        self.worker = WorkerProcess(env, self.folder / "worker.log").start()
        return self

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.server.stop()

    def runs(self, cid: str) -> int:
        """The worker's finished ``compress_session`` tasks of the conversation, busy ones too
        (the compaction log has no row for a run that found the lease held)."""
        if self.worker is None:
            return 0
        mark = f'"conversation_id": "{cid}"'
        return sum(
            1 for line in self.worker.text().splitlines() if DONE_EVENT in line and mark in line
        )

    def wait_runs(self, cid: str, count: int) -> None:
        """Until the worker has finished ``count`` tasks of the conversation."""
        log = self.worker.log if self.worker is not None else None
        wait_for(lambda: self.runs(cid) >= count, RUN_TIMEOUT, f"{count} runs of {cid}", log)


def start_stack(
    folder: Path, server: LLMServer | None = None, **summary_env: str
) -> FrameworkStack:
    """The worker and the model server (default: one answering ``Replies``), started."""
    server = server or LLMServer(default=Replies()).start()
    stack = FrameworkStack(folder, server, summary_env=dict(summary_env))
    try:
        return stack.start()
    except BaseException:
        stack.stop()
        raise


@contextlib.contextmanager
def host_on(stack: FrameworkStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recap]:
    """A host on the stack, its settings in the environment too (``compress_later`` reads the
    broker folder from there), with the enqueue helper's apps reset before and after."""
    from recap.workers import enqueue

    for key, value in stack.host_env().items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    enqueue.reset()
    host = Recap(get_settings())
    try:
        yield host
    finally:
        enqueue.reset()
        host.engine.dispose()
