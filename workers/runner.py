"""``recap worker``: start workers with defaults that suit this workload, and keep them running.

Model calls are I/O-bound, so the ``compress`` queue runs on a threads pool with high
concurrency; sweeps, cleanup and reconcile are short database jobs on a small threads pool too
(no forked copies of the worker, and no litellm: only a process that consumes the compress queue
loads the model client). One Celery worker has one pool, so each queue gets a worker process of
its own. This module starts
them as children and supervises them: a child that exits while nobody asked it to (a crash, an
"Unrecoverable error", a kill) is started again after a backoff that doubles with each death that
came soon after its start; after ``MAX_FAST_DEATHS`` such deaths in a row the supervisor stops
the others and exits non-zero, so a broken setup fails loudly instead of looping. SIGTERM and
SIGINT are forwarded (a warm shutdown), and then nothing is restarted.

The compress worker also consumes Celery's default queue (``workers.app.DEFAULT_QUEUE``), so a
plain ``send_task`` by name reaches it, and the ``memory`` queue (``recap.extract_memories``),
so memory needs no process of its own (``recap worker --queues memory`` starts one).

The supervisor itself imports neither Celery nor SQLAlchemy nor litellm (the queue names come from
``workers.queues``): it only starts, watches and signals its children.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from recap.workers.queues import COMPRESS_QUEUE, DEFAULT_QUEUE, MAINTENANCE_QUEUE, MEMORY_QUEUE

COMPRESS_CONCURRENCY = 16  # threads: each mostly waits on the model's reply
MAINTENANCE_CONCURRENCY = 2  # threads: short, CPU-light database batches
POLL_SECONDS = 0.5  # how often the supervisor looks at its children


@dataclass(frozen=True)
class RestartPolicy:
    """When a dead child is started again, and when the supervisor gives up."""

    first_delay: float = 1.0  # seconds before restarting a child that died soon after its start
    max_delay: float = 30.0  # the delay doubles with each fast death, up to this
    fast_seconds: float = 60.0  # a child that lived less than this died "fast"
    max_fast_deaths: int = 5  # this many fast deaths in a row: give up, exit non-zero

    def delay(self, fast_deaths: int) -> float | None:
        """Seconds to wait before the next start after ``fast_deaths`` fast deaths in a row
        (0 after a child that ran for a while), or None to give up."""
        if fast_deaths > self.max_fast_deaths:
            return None
        if fast_deaths == 0:
            return 0.0
        return float(min(self.first_delay * 2 ** (fast_deaths - 1), self.max_delay))


DEFAULT_POLICY = RestartPolicy()
GAVE_UP_EXIT = 1  # the exit code when a child kept dying (its own code, if non-zero, wins)


# The Celery worker options `recap worker` sets, each with its short spelling: one the user
# gives (in any spelling: --concurrency 2, --concurrency=2, -c 2, -c2) replaces the default.
DEFAULT_OPTIONS = {
    "--queues": "-Q",
    "--hostname": "-n",
    "--loglevel": "-l",
    "--pool": "-P",
    "--concurrency": "-c",
    "--schedule": "-s",
}


def given_options(extra: Sequence[str]) -> set[str]:
    """The options of ``DEFAULT_OPTIONS`` (by their long name) that ``extra`` gives."""
    short = {letter: name for name, letter in DEFAULT_OPTIONS.items()}
    found = set()
    for arg in extra:
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            if name in DEFAULT_OPTIONS:
                found.add(name)
        elif arg.startswith("-") and arg[:2] in short:
            found.add(short[arg[:2]])
    return found


def worker_argv(queue: str, *, beat: bool, extra: Sequence[str]) -> list[str]:
    """Celery worker arguments for one queue: the defaults below, less those the user gave
    (theirs replace ours, never follow them), then the user's arguments."""
    queues = queue
    if queue == COMPRESS_QUEUE:
        pool = {"--pool": "threads", "--concurrency": str(COMPRESS_CONCURRENCY)}
        queues = f"{COMPRESS_QUEUE},{DEFAULT_QUEUE},{MEMORY_QUEUE}"
    elif queue == MEMORY_QUEUE:  # model calls, I/O-bound like compression
        pool = {"--pool": "threads", "--concurrency": str(COMPRESS_CONCURRENCY)}
    elif queue == MAINTENANCE_QUEUE:
        pool = {"--pool": "threads", "--concurrency": str(MAINTENANCE_CONCURRENCY)}
    else:
        pool = {}
    # a node name per process (the supervisor's pid): two `recap worker`s on one host must not
    # share one, and a restarted child keeps its predecessor's
    node = f"{queue}-{os.getpid()}@%h"
    defaults = {"--queues": queues, "--hostname": node, "--loglevel": "INFO", **pool}
    if beat:
        defaults["--schedule"] = os.path.join(".recap", "celerybeat-schedule")
    given = given_options(extra)
    argv = ["worker"]
    for name, value in defaults.items():
        if name not in given:
            argv += [name, value]
    if beat:
        argv.append("--beat")
    return [*argv, *extra]


def global_argv() -> list[str]:
    """Options before the subcommand: no start banner when the log stream must be pure JSON."""
    from recap.core.settings import get_settings

    return ["--quiet"] if get_settings().log_json else []


def child_command(queue: str, *, beat: bool, extra: Sequence[str]) -> list[str]:
    """The command line of one worker child."""
    argv = worker_argv(queue, beat=beat, extra=extra)
    return [sys.executable, "-m", "celery", "-A", "recap.workers.app", *global_argv(), *argv]


def run_one(queue: str, *, beat: bool, extra: Sequence[str]) -> int:
    """One queue's worker as a supervised child."""
    return run_queues([queue], beat=beat, extra=extra)


def run_both(*, beat: bool, extra: Sequence[str]) -> int:
    """A compress and a maintenance worker as supervised children (beat, if asked, embedded in
    the maintenance one)."""
    return run_queues([COMPRESS_QUEUE, MAINTENANCE_QUEUE], beat=beat, extra=extra)


def run_queues(queues: Sequence[str], *, beat: bool, extra: Sequence[str]) -> int:
    """Build the children's command lines here (the settings are checked and read), then
    become the supervisor: this process is replaced by ``python -m workers.runner``, which
    imports only what supervising needs (see ``become_supervisor``)."""
    from recap.core.settings import get_settings
    from recap.core.storage.private import make_folder

    if beat:
        make_folder(".recap")  # beat's schedule file; 0700 like every folder Recap makes
    beat_queue = MAINTENANCE_QUEUE if MAINTENANCE_QUEUE in queues else queues[0]
    commands = {
        queue: child_command(queue, beat=beat and queue == beat_queue, extra=extra)
        for queue in queues
    }
    settings = get_settings()
    plan = {"commands": commands, "log_json": settings.log_json, "log_level": settings.log_level}
    become_supervisor(plan)


def become_supervisor(plan: dict[str, Any]) -> NoReturn:
    """Replace this process, same pid, with a fresh interpreter that runs ``main(plan)``.

    The command line checked the settings, which loads pydantic and SQLAlchemy (the database
    URL is parsed); a supervisor that kept them would hold tens of MB for the worker's whole
    life. The plan (command lines and log format) travels as one JSON argument.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "recap.workers.runner", json.dumps(plan)]
    os.execv(sys.executable, argv)


def main(argv: Sequence[str]) -> int:
    """``python -m workers.runner PLAN``: supervise the children the JSON plan names."""
    from recap.workers.logs import configure_logging

    plan = json.loads(argv[0])
    configure_logging(json_output=bool(plan["log_json"]), level=str(plan["log_level"]))
    commands = {str(name): [str(a) for a in command] for name, command in plan["commands"].items()}
    return Supervisor(commands=commands).run()


@dataclass(kw_only=True)
class Child:
    """One supervised process and its recent history."""

    name: str
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    fast_deaths: int = 0
    restart_at: float | None = None


@dataclass(kw_only=True)
class Supervisor:
    """Start each command as a child, restart the ones that die, stop all on a signal."""

    commands: dict[str, list[str]]
    policy: RestartPolicy = DEFAULT_POLICY
    children: list[Child] = field(default_factory=list)
    stopping: bool = False
    gave_up: Child | None = None

    def run(self) -> int:
        import structlog

        self.log = structlog.get_logger("recap.worker")
        self.children = [
            Child(name=name, command=command) for name, command in self.commands.items()
        ]
        for child in self.children:
            self._start(child)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self.stopping:
                self._tick(time.monotonic())
                time.sleep(POLL_SECONDS)
        finally:
            self._stop_all()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self._exit_code()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stopping = True
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signum)

    def _start(self, child: Child) -> None:
        child.process = subprocess.Popen(child.command)
        child.started_at = time.monotonic()
        child.restart_at = None
        self.log.info("worker_child_started", child=child.name, pid=child.process.pid)

    def _tick(self, now: float) -> None:
        for child in self.children:
            if self.stopping:
                return
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._start(child)
                continue
            if child.process is not None and child.process.poll() is not None:
                self._died(child, now)

    def _died(self, child: Child, now: float) -> None:
        assert child.process is not None
        lived = now - child.started_at
        child.fast_deaths = child.fast_deaths + 1 if lived < self.policy.fast_seconds else 0
        delay = self.policy.delay(child.fast_deaths)
        fields = {
            "child": child.name,
            "pid": child.process.pid,
            "exit_code": child.process.returncode,
            "lived_s": round(lived, 1),
        }
        if delay is None:
            self.log.error("worker_child_gave_up", fast_deaths=child.fast_deaths, **fields)
            self.gave_up = child
            self.stopping = True
            return
        self.log.warning("worker_child_died", restart_in_s=round(delay, 1), **fields)
        child.restart_at = now + delay

    def _stop_all(self) -> None:
        self._forward(signal.SIGTERM)
        for child in self.children:
            if child.process is not None:
                child.process.wait()

    def _exit_code(self) -> int:
        if self.gave_up is not None:
            assert self.gave_up.process is not None
            return abs(self.gave_up.process.returncode or 0) or GAVE_UP_EXIT
        codes = [abs(c.process.returncode or 0) for c in self.children if c.process is not None]
        return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
