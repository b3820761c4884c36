"""``recap worker``: start workers with defaults that suit this workload.

Model calls are I/O-bound, so the ``compress`` queue runs on a threads pool with high
concurrency; sweeps, cleanup and reconcile are short database jobs on a small prefork pool. One
Celery worker has one pool, so serving both queues means two worker processes: this module
supervises them and forwards signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from workers.app import COMPRESS_QUEUE, MAINTENANCE_QUEUE

COMPRESS_CONCURRENCY = 16  # threads: each mostly waits on the model's reply
MAINTENANCE_CONCURRENCY = 2  # processes: short, CPU-light database batches
POLL_SECONDS = 0.5


def worker_argv(queue: str, *, beat: bool, extra: Sequence[str]) -> list[str]:
    """Celery worker arguments for one queue; arguments the user gave come last and win."""
    if queue == COMPRESS_QUEUE:
        pool = ["--pool", "threads", "--concurrency", str(COMPRESS_CONCURRENCY)]
    elif queue == MAINTENANCE_QUEUE:
        pool = ["--pool", "prefork", "--concurrency", str(MAINTENANCE_CONCURRENCY)]
    else:
        pool = []
    argv = ["worker", "--queues", queue, "--hostname", f"{queue}@%h", "--loglevel", "INFO", *pool]
    if beat:
        argv += ["--beat", "--schedule", os.path.join(".recap", "celerybeat-schedule")]
    return [*argv, *extra]


def global_argv() -> list[str]:
    """Options before the subcommand: no start banner when the log stream must be pure JSON."""
    from core.settings import get_settings

    return ["--quiet"] if get_settings().log_json else []


def run_one(queue: str, *, beat: bool, extra: Sequence[str]) -> int:
    """Run one worker in this process."""
    from workers.app import app

    if beat:
        os.makedirs(".recap", exist_ok=True)
    app.start([*global_argv(), *worker_argv(queue, beat=beat, extra=extra)])
    return 0


def run_both(*, beat: bool, extra: Sequence[str]) -> int:
    """Run a compress and a maintenance worker as children; stop both when either stops."""
    if beat:
        os.makedirs(".recap", exist_ok=True)
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "workers.app",
                *worker_argv(queue, beat=beat and queue == MAINTENANCE_QUEUE, extra=extra),
            ]
        )
        for queue in (COMPRESS_QUEUE, MAINTENANCE_QUEUE)
    ]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    try:
        while all(child.poll() is None for child in children):
            time.sleep(POLL_SECONDS)
    finally:
        forward(signal.SIGTERM, None)
        for child in children:
            child.wait()
    return max(abs(child.returncode or 0) for child in children)
