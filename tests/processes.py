"""Child processes of the tests and benchmarks (workers, Flower, the model server)."""

from __future__ import annotations

import os
import signal
import subprocess

STOP_TIMEOUT = 30.0  # seconds a warm shutdown may take before the group is killed


def stop_group(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process's group (a warm shutdown), SIGKILL it if that hangs. The process
    must have been started with ``start_new_session=True``."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
