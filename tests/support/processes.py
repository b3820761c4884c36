"""Child processes of the tests and benchmarks, and waiting for something with a deadline.

``wait_for`` is the one way a test or benchmark waits: it polls a condition until it holds and
fails, quoting a log's tail when given one, once its deadline has passed (never a fixed sleep).
``stop_group`` stops a child started in a session of its own (workers, Flower, the model
server); ``free_port`` finds a port for a server of the test's own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STOP_TIMEOUT = 30.0  # seconds a warm shutdown may take before the group is killed
WAIT_POLL_SECONDS = 0.05  # how often a condition is checked
LOG_TAIL_CHARS = 4_000  # how much of a log a failed wait quotes


class WaitTimeout(AssertionError, TimeoutError):
    """A condition that did not hold in time: a test failure (AssertionError) that code
    catching TimeoutError also sees."""


def wait_for(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    log: Path | None = None,
    poll: float = WAIT_POLL_SECONDS,
) -> Any:
    """Poll ``check()`` until it returns something true and return that; after ``timeout``
    seconds raise ``WaitTimeout`` naming ``what`` (with the tail of ``log``, when given)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log and log.exists() else ""
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}\n{tail}".rstrip())
        time.sleep(poll)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid`` (from /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def stop_group(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process's group (a warm shutdown), SIGKILL it if that hangs. The process
    must have been started with ``start_new_session=True``."""
    stop_groups([process], timeout)


def stop_groups(processes: list[subprocess.Popen[bytes]], timeout: float = STOP_TIMEOUT) -> None:
    """``stop_group`` for several processes at once: all are signalled, then waited for, so
    their warm shutdowns overlap."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
