"""A real ``recap worker`` process for fault tests and benchmarks, with what it needs around it.

``WorkerProcess`` starts ``python -m workers.cli worker ...`` in a new session with an explicit
environment, its log (stderr and stdout) in a file the test can read and quote, and stops it by
its process group. ``Gate`` holds the local model server's replies until the test opens it, so a
test can restart a server "during the model call" without a fixed sleep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.llm_server import stand_in_summary
from tests.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 120.0  # a worker that calls a model imports litellm before it is ready
WAIT_POLL_SECONDS = 0.1  # how often a condition is checked
LOG_TAIL_CHARS = 4_000  # how much of a worker's log a failed wait quotes
GATE_TIMEOUT = 120.0  # a held reply is let go after this, so a failed test never hangs a thread


def wait_for(check: Callable[[], Any], timeout: float, what: str, log: Path | None = None) -> Any:
    """Poll ``check()`` until it returns something true; fail with ``what`` (and the log's tail)
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")
        time.sleep(WAIT_POLL_SECONDS)


@dataclass
class Gate:
    """A model reply function that holds replies while armed; ``arrived`` counts the requests
    that reached it."""

    arrived: int = 0
    _open: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._open.set()

    def arm(self) -> None:
        """Hold every reply from now until ``open()``."""
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def __call__(self, body: dict[str, Any]) -> str:
        with self._lock:
            self.arrived += 1
        self._open.wait(GATE_TIMEOUT)
        return stand_in_summary(body)


def worker_env(**values: str | None) -> dict[str, str]:
    """The test process's environment with these RECAP_* values (None removes one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECAP_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: v for k, v in values.items() if v is not None})
    return env


@dataclass
class WorkerProcess:
    """``recap worker`` as a child process of the test."""

    env: dict[str, str]
    log: Path
    args: tuple[str, ...] = ("--queues", "compress")
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        command = [sys.executable, "-m", "workers.cli", "worker", *self.args]
        command += ["--without-mingle", "--without-gossip"]  # no waiting for neighbours
        sink = self.log.open("ab")
        self.process = subprocess.Popen(
            command, env=self.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.wait_ready(1)
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, times: int, timeout: float = READY_TIMEOUT) -> None:
        """Until the log says ``ready.`` ``times`` times (once per start of a child)."""
        wait_for(lambda: self.text().count(" ready.") >= times, timeout, "the worker", self.log)

    def wait_log(self, needle: str, timeout: float, count: int = 1) -> None:
        wait_for(lambda: self.text().count(needle) >= count, timeout, repr(needle), self.log)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def children(self) -> list[int]:
        """The supervisor's child processes (the Celery workers)."""
        assert self.process is not None
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in path.read_text().split()] if path.exists() else []

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)
