"""A Celery worker as a child process of a test or benchmark, and what it needs around it.

``WorkerProcess`` is the one way the tests and benchmarks start a worker: ``recap worker`` (the
default) or ``celery -A workers.app worker`` (``program=CELERY``), in a new session, with the
environment ``worker_env`` builds, its log in a file the test can read and quote, ready when the
log says so, stopped by its process group. ``wait_for`` (from ``tests.support.processes``) is how a
test waits for anything the worker does. ``Gate`` holds the local model server's replies until the
test opens it, so a test can restart a server "during the model call" without a fixed sleep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.llm_server import stand_in_summary
from tests.support.processes import WaitTimeout, children_of, stop_group, stop_groups, wait_for

__all__ = [
    "CELERY",
    "RECAP",
    "ROOT",
    "Gate",
    "WaitTimeout",
    "WorkerProcess",
    "stop_workers",
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 120.0  # a worker that calls a model imports litellm before it is ready
GATE_TIMEOUT = 120.0  # a held reply is let go after this, so a failed test never hangs a thread
RECAP = ("recap.workers.cli", "worker")  # `recap worker`: the supervisor and its Celery children
CELERY = ("celery", "-A", "recap.workers.app", "--quiet", "worker")  # one Celery worker, no banner
READY_LINE = " ready."  # what Celery logs once a worker consumes


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
    """The environment of a worker child: the test process's without its RECAP_* values,
    ``PYTHONPATH`` set to the checkout, then these values (None removes one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECAP_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: v for k, v in values.items() if v is not None})
    return env


@dataclass
class WorkerProcess:
    """A Celery worker as a child process: ``python -m <program> <args>``, its stdout and stderr
    in ``log`` (stdout in ``stdout`` instead, when given: Celery's banner apart from the log)."""

    env: dict[str, str]
    log: Path
    args: tuple[str, ...] = ("--queues", "compress")
    process: subprocess.Popen[bytes] | None = None
    program: tuple[str, ...] = RECAP
    stdout: Path | None = None

    def launch(self) -> WorkerProcess:
        """Start the worker without waiting for it to be ready."""
        command = [sys.executable, "-m", *self.program, *self.args]
        command += ["--without-mingle", "--without-gossip"]  # no waiting for neighbours
        with self.log.open("ab") as sink:
            out = self.stdout.open("ab") if self.stdout is not None else None
            try:
                self.process = subprocess.Popen(
                    command,
                    env=self.env,
                    stdout=out or sink,
                    stderr=sink if out else subprocess.STDOUT,
                    start_new_session=True,
                )
            finally:
                if out is not None:
                    out.close()
        return self

    def start(self, timeout: float = READY_TIMEOUT) -> WorkerProcess:
        """Start the worker and wait until it consumes."""
        self.launch()
        self.wait_ready(1, timeout)
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, times: int, timeout: float = READY_TIMEOUT) -> None:
        """Until the log says ``ready.`` ``times`` times (once per start of a child)."""
        self.wait_log(READY_LINE, timeout, times, what="the worker")

    def wait_log(self, needle: str, timeout: float, count: int = 1, what: str = "") -> None:
        """Until ``needle`` is in the log ``count`` times; a worker that exits first fails at
        once, quoting its log."""

        def seen() -> bool:
            if self.text().count(needle) >= count:
                return True
            if not self.alive:
                raise AssertionError(f"the worker exited waiting for {needle!r}\n{self.text()}")
            return False

        wait_for(seen, timeout, what or repr(needle), self.log)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def children(self) -> list[int]:
        """The supervisor's child processes (the Celery workers)."""
        assert self.process is not None
        return children_of(self.process.pid)

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)


def stop_workers(workers: list[WorkerProcess]) -> None:
    """Stop several workers at once (their warm shutdowns overlap)."""
    stop_groups([worker.process for worker in workers if worker.process is not None])
