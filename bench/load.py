"""Load: 200 conversations x 20 turns through one ``recap worker`` on Redis and PostgreSQL.

A host (8 threads, like chat servers) adds each turn (a user message and the assistant's reply)
through ``core.service`` and enqueues compression after it with ``workers.enqueue.compress_later``
(4,000 tasks). One ``recap worker`` process (compress and maintenance, as started in production)
serves them on a Redis server of the benchmark's own, over a fresh PostgreSQL database; the model
is the local OpenAI-compatible server in a process of its own, answering in 0.2 s. Conversations
have a 1,500-token window, so each is summarized about twice during its 20 turns.

- ``load_duplicate_summaries``: summaries built on the same predecessor as another summary of their
  conversation (two runs that both paid to summarize the same state); bound 0.
- ``load_lost_messages``: messages added by the host that are not on the branch ``export`` and
  ``assemble`` read, in the order they were added; bound 0.
- ``load_wasted_model_calls``: runs whose model summary was rejected (``summary rejected`` in the
  compaction log): calls paid for and thrown away; bound 0.
- ``load_tasks_per_second``: tasks enqueued over the seconds from the first enqueue until the
  queues are empty and no lease is held (reported).
- ``load_summaries``: summaries stored (reported; it shows the window made summaries happen).

Then the two-process mode: the same load, 100 conversations x 20 turns (2,000 tasks), served by two
``recap worker`` processes on one queue, over PostgreSQL, once on a Redis server and once on a
RabbitMQ node of the benchmark's own (a node is skipped, and says so, where ``rabbitmq-server``
is not installed): ``load_two_processes_duplicate_summaries_{redis,rabbitmq}`` and
``load_two_processes_lost_messages_{redis,rabbitmq}``, bound 0, and their tasks per second
(reported). A run is over when the workers' logs report a finished run (``task_done``) for every
task sent and no lease is held, which reads the same on both brokers.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import Figure

CONVERSATIONS = 200
TWO_PROCESS_CONVERSATIONS = 100  # the two-process runs, once per broker
TURNS = 20
HOST_THREADS = 8  # concurrent chat servers adding turns and enqueueing
MODEL_SECONDS = 0.2
WINDOW = 1_500  # small, so each conversation is summarized about twice in its 20 turns
DRAIN_TIMEOUT = 900.0  # seconds the worker may take to finish everything
POLL_SECONDS = 0.5  # how often the drain is checked (it reads every worker's log)
PROSE = (
    "I moved the parsing into a helper so callers no longer need the file format, ran the "
    "focused tests and then the suite; the one failure left is the fixture that expects the old "
    "message. Next I will check the two call sites that build their own readers."
)


def turn(cid: str, n: int) -> list[dict[str, str]]:
    """One turn: a request naming a file and a test, and a reply of about 80 tokens."""
    ask = f"Turn {n}: fix src/{cid}/mod_{n}.py, test_mod_{n} fails with KeyError 'k{n}'."
    done = f"Updated src/{cid}/mod_{n}.py for test_mod_{n}. {PROSE}"
    return [{"role": "user", "content": ask}, {"role": "assistant", "content": done}]


@contextmanager
def stack(
    folder: Path, broker_kind: str = "redis", processes: int = 1
) -> Iterator[tuple[Any, str, list[Any]]]:
    """(engine, broker URL, workers) with the model server, a broker of the benchmark's own and
    ``processes`` workers running (one ``recap worker`` with both queues; several with the
    compress queue each, as a scaled-out deployment runs them)."""
    from bench.compress import model_process, stand_in_env
    from bench.services import broker, database
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.support.worker_stack import WorkerProcess, stop_workers, worker_env

    model = model_process(MODEL_SECONDS)
    try:
        api_base = str(model.stdout.readline().decode().strip())  # type: ignore[union-attr]
        with database() as url, broker(broker_kind) as broker_url:
            engine = make_engine(url)
            upgrade(engine)
            env = worker_env(**stand_in_env(folder, url, broker_url, api_base))
            args = () if processes == 1 else ("--queues", "compress")
            logs = [folder / f"{broker_kind}-{processes}-{n}.log" for n in range(processes)]
            workers = [WorkerProcess(env, log, args=args) for log in logs]
            try:
                with ThreadPoolExecutor(processes) as starting:
                    list(starting.map(WorkerProcess.start, workers))
                yield engine, broker_url, workers
            finally:
                stop_workers(workers)
                engine.dispose()
    finally:
        model.kill()
        model.wait()


def host(engine: Any, broker_url: str, conversations: int = CONVERSATIONS) -> tuple[int, float]:
    """Create the conversations, then add every turn and enqueue after it, from several threads;
    (tasks enqueued, time of the first enqueue)."""
    from recap.core import service
    from recap.core.settings import get_settings
    from recap.workers.enqueue import compress_later

    settings = get_settings()
    ids = [f"load-{n:03d}" for n in range(conversations)]
    for cid in ids:
        service.new_conversation(engine, settings, cid, max_input_tokens=WINDOW)
    started = time.monotonic()

    def chat(cid: str) -> int:
        for n in range(TURNS):
            service.add_many(engine, cid, turn(cid, n))
            compress_later(cid, broker_url=broker_url)
        return TURNS

    with ThreadPoolExecutor(HOST_THREADS) as pool:
        enqueued = sum(pool.map(chat, ids))
    return enqueued, started


def finished_runs(workers: list[Any]) -> int:
    """Compression runs the workers' logs report done (a ``task_done`` line each)."""
    return sum(
        1
        for worker in workers
        for line in worker.text().splitlines()
        if '"task_done"' in line and '"recap.compress_session"' in line
    )


def drained(engine: Any, workers: list[Any], enqueued: int) -> bool:
    """Every task sent has run to its end, and no lease is held."""
    from sqlalchemy import func, select

    from recap.core.storage.models import CONVERSATIONS as TABLE

    if finished_runs(workers) < enqueued:
        return False
    with engine.connect() as connection:
        held = connection.execute(
            select(func.count()).where(TABLE.c.lease_owner.is_not(None))
        ).scalar()
    return not held


def lost_messages(engine: Any, conversations: int = CONVERSATIONS) -> int:
    """Messages the host added that are not on the exported branch, in order."""
    from recap.core import service

    lost = 0
    for n in range(conversations):
        cid = f"load-{n:03d}"
        expected = [m["content"] for t in range(TURNS) for m in turn(cid, t)]
        exported = service.export_conversation(engine, cid)
        messages = exported["messages"]
        stored = [m.get("content") for m in messages if m.get("role") in ("user", "assistant")]
        lost += len(expected) - sum(1 for a, b in zip(expected, stored, strict=False) if a == b)
    return lost


def counts(engine: Any) -> dict[str, int]:
    """Summaries, duplicate summaries and rejected summaries, from the database."""
    from sqlalchemy import func, select

    from recap.core.storage.models import SUMMARIES
    from recap.workers.compress import COMPACTION_LOG

    s, log = SUMMARIES.c, COMPACTION_LOG.c
    with engine.connect() as connection:
        total = connection.execute(select(func.count()).select_from(SUMMARIES)).scalar() or 0
        groups = (
            select(func.count().label("n"))
            .select_from(SUMMARIES)
            .group_by(s.conversation_id, s.previous_summary_id)
        )
        duplicates = connection.execute(
            select(func.coalesce(func.sum(groups.subquery().c.n - 1), 0))
        ).scalar()
        rejected = connection.execute(
            select(func.count()).where(log.action == "failed", log.reason.like("summary rejected%"))
        ).scalar()
    return {"summaries": total, "duplicates": int(duplicates or 0), "rejected": rejected or 0}


def one_load(
    folder: Path, broker_kind: str, processes: int, conversations: int
) -> dict[str, float]:
    """Run the load once; its counts, lost messages and tasks per second."""
    from tests.support.worker_stack import wait_for

    with stack(folder, broker_kind, processes) as (engine, broker_url, workers):
        enqueued, started = host(engine, broker_url, conversations)
        wait_for(
            lambda: drained(engine, workers, enqueued),
            DRAIN_TIMEOUT,
            "the load",
            workers[0].log,
            poll=POLL_SECONDS,
        )
        seconds = time.monotonic() - started
        found = counts(engine)
        lost = lost_messages(engine, conversations)
    if not found["summaries"]:
        raise SystemExit("bench.load: no summary was made; the window is too large to test")
    return {**found, "lost": lost, "per_second": round(enqueued / seconds, 1), "tasks": enqueued}


def run(_data: list[Path] | None = None) -> list[Figure]:
    from tests.support.services import missing_rabbitmq

    with tempfile.TemporaryDirectory(prefix="recap-load-") as tmp:
        folder = Path(tmp)
        os.environ["RECAP_OUTPUT_DIR"] = str(folder / "outputs")
        found = one_load(folder, "redis", 1, CONVERSATIONS)
        kinds = ["redis"] if missing_rabbitmq() else ["redis", "rabbitmq"]
        two = {kind: one_load(folder, kind, 2, TWO_PROCESS_CONVERSATIONS) for kind in kinds}
    figures = [
        Figure("load_duplicate_summaries", found["duplicates"], "== 0",
               f"summaries sharing a predecessor, {CONVERSATIONS} x {TURNS} turns, one worker"),
        Figure("load_lost_messages", found["lost"], "== 0",
               "added messages missing from the exported branch after the load"),
        Figure("load_wasted_model_calls", found["rejected"], "== 0",
               "runs whose model summary was rejected (compaction log), paid and thrown away"),
        Figure("load_tasks_per_second", found["per_second"], "",
               f"{found['tasks']:.0f} tasks from the first enqueue until drained, model at "
               f"{MODEL_SECONDS} s, Redis + PostgreSQL, one recap worker"),
        Figure("load_summaries", found["summaries"], "",
               f"summaries stored during the load ({CONVERSATIONS} conversations)"),
    ]  # fmt: skip
    for kind, result in two.items():
        name = "Redis" if kind == "redis" else "RabbitMQ"
        where = (
            f"{TWO_PROCESS_CONVERSATIONS} x {TURNS} turns ({result['tasks']:.0f} tasks), two "
            f"`recap worker --queues compress` processes, {name} + PostgreSQL"
        )
        figures += [
            Figure(f"load_two_processes_duplicate_summaries_{kind}", result["duplicates"],
                   "== 0", f"summaries sharing a predecessor, {where}; "
                   f"{result['summaries']:.0f} summaries"),
            Figure(f"load_two_processes_lost_messages_{kind}", result["lost"], "== 0",
                   f"added messages missing from the exported branch, {where}"),
            Figure(f"load_two_processes_tasks_per_second_{kind}", result["per_second"], "",
                   f"tasks from the first enqueue until drained, {where}"),
        ]  # fmt: skip
    return figures
