"""Scale-out: lean worker processes, and two ``recap worker`` processes sharing one queue.

The maintenance worker is a real ``recap worker --queues maintenance`` process started with
``PYTHONPROFILEIMPORTTIME=1``, so every module any of its processes imports is written to its log:
it runs its tasks without importing litellm (even with a summary model configured), on a threads
pool (no forked children), under a supervisor that imports neither Celery nor SQLAlchemy.

The load test runs two ``recap worker --queues compress`` processes against one PostgreSQL
database and one broker (a Redis server of its own, and a fresh vhost on the test run's RabbitMQ
node), while host threads add turns and enqueue a compression after each. The model server counts
how many calls are in flight per conversation: single flight means never more than one. Then: one
summary per predecessor and per cutoff, no run that found its summary already written by another,
no lease left held, every added message on the exported branch, and both processes served tasks.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

import recap.core.storage.db
from recap.core import service
from recap.core.settings import get_settings
from recap.core.storage.db import make_engine, pool_settings, size_pool
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import CONVERSATIONS, SUMMARIES, CompactionLog, table_of
from recap.workers.enqueue import compress_later, producer_app, reset
from recap.workers.queues import MAINTENANCE_QUEUE
from recap.workers.tasks import consumes_compressions, pool_connections
from tests.support.llm_server import LLMServer, stand_in_summary
from tests.support.processes import children_of
from tests.support.services import RedisServer, need_redis_server
from tests.support.worker_stack import WorkerProcess, stop_workers, wait_for, worker_env

LOG = table_of(CompactionLog)
IMPORT_HEADER = "import time: self [us] | cumulative | imported package"
WINDOW = 3_000  # small: a conversation crosses its trigger after about a dozen turns
CONVERSATIONS_UNDER_LOAD = 12
FIRST_TURNS = 6  # imported at once, under the trigger
ADDED_TURNS = 10  # then added one by one, a compression enqueued after each
HOST_THREADS = 4
WORKER_THREADS = 4
MODEL_SECONDS = 0.3
DRAIN_TIMEOUT = 120.0
TASK_TIMEOUT = 60.0
CONVERSATION_TAG = re.compile(r"conv=(s\d+)")


def imported(log_text: str, module: str) -> bool:
    """Whether an import-time profile records ``module`` (or one of its submodules)."""
    pattern = rf"^import time:\s+\d+ \|\s+\d+ \|\s+{re.escape(module)}(\.\S+)?\s*$"
    return re.search(pattern, log_text, re.MULTILINE) is not None


def task_runs(log_text: str, task: str) -> int:
    """Task runs a worker's log reports done (one ``task_done`` line each)."""
    return sum(1 for line in log_text.splitlines() if '"task_done"' in line and f'"{task}"' in line)


# --- lean processes ----------------------------------------------------------------------------


def test_pool_connections_follow_the_pool_and_its_concurrency() -> None:
    """One connection per thread; one per prefork child and for a solo worker."""
    assert pool_connections("threads", 16) == 16
    threads = type("TaskPool", (), {"__module__": "celery.concurrency.thread"})
    assert pool_connections(threads, 4) == 4  # the class a worker's options carry
    assert pool_connections("prefork", 8) == 1
    assert pool_connections("solo", None) == 1
    assert pool_connections("threads", None) >= 1  # unset: the CPU count


def test_only_a_worker_of_the_compress_or_default_queue_loads_the_model_client() -> None:
    assert consumes_compressions({"queues": ["compress", "celery"]})
    assert consumes_compressions({"queues": "celery"})
    assert consumes_compressions({})  # every queue
    assert not consumes_compressions({"queues": ["maintenance"]})


def test_a_sized_pool_opens_no_more_connections_than_its_size() -> None:
    """After ``size_pool(n)`` a server database's engine keeps n connections and opens no more."""
    saved = pool_settings()
    try:
        size_pool(3)
        engine = make_engine("postgresql+psycopg://user@127.0.0.1:1/none")
        assert (engine.pool.size(), engine.pool._max_overflow) == (3, 0)  # type: ignore[attr-defined]
        with pytest.raises(ValueError):
            size_pool(0)
    finally:
        recap.core.storage.db._pool.update(saved)  # other tests' engines keep the default pool


def test_the_maintenance_worker_runs_its_tasks_without_litellm_or_forked_children(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """A summary model is configured, yet neither the supervisor nor the maintenance worker
    imports litellm, before or while running reconcile and a sweep; the supervisor imports no
    Celery or SQLAlchemy; the maintenance worker has no pool processes."""
    url = f"sqlite:///{tmp_path / 'lean.db'}"
    upgrade(make_engine(url))
    env = worker_env(
        RECAP_DATABASE_URL=url,
        RECAP_BROKER_URL=private_redis.url,
        RECAP_SUMMARY_MODEL="openai/stand-in",
        RECAP_SUMMARY_API_BASE="http://127.0.0.1:9/v1",
        RECAP_SUMMARY_API_KEY="test-key",
        RECAP_OUTPUT_DIR=str(tmp_path / "outputs"),
        PYTHONPROFILEIMPORTTIME="1",
    )
    worker = WorkerProcess(env, tmp_path / "worker.log", args=("--queues", MAINTENANCE_QUEUE))
    worker.start()
    try:
        sender = producer_app(private_redis.url)
        for task in ("recap.reconcile", "recap.sweep_idle_tool_results"):
            sender.send_task(task, queue=MAINTENANCE_QUEUE)
        wait_for(
            lambda: (
                task_runs(worker.text(), "recap.sweep_idle_tool_results")
                and task_runs(worker.text(), "recap.reconcile")
            ),
            TASK_TIMEOUT,
            "reconcile and the sweep",
            worker.log,
        )
        assert worker.process is not None
        supervised = children_of(worker.process.pid)
        assert len(supervised) == 1  # the maintenance worker
        assert children_of(supervised[0]) == []  # a threads pool: no forked copies
        log = worker.text()
    finally:
        worker.stop()
    assert imported(log, "celery") and imported(log, "sqlalchemy")  # the profile is recorded
    assert not imported(log, "litellm")
    processes = log.split(IMPORT_HEADER)
    # the command line (settings checked), the supervisor it becomes, then the worker
    assert len(processes) == 4, len(processes)
    supervisor = processes[2]
    assert imported(supervisor, "recap.workers.queues")  # what `python -m workers.runner` imports
    for heavy in ("celery", "kombu", "sqlalchemy", "litellm"):
        assert not imported(supervisor, heavy), heavy


# --- two worker processes, one queue, one database ---------------------------------------------


class InFlight:
    """A model reply that counts concurrent calls per conversation while it waits."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> str:
        found = CONVERSATION_TAG.search(json_text(body))
        cid = found.group(1) if found else "?"
        with self.lock:
            self.calls += 1
            self.now[cid] = self.now.get(cid, 0) + 1
            self.peak[cid] = max(self.peak.get(cid, 0), self.now[cid])
        try:
            time.sleep(MODEL_SECONDS)  # the model thinking, while the count is up
            return stand_in_summary(body)
        finally:
            with self.lock:
                self.now[cid] -= 1


def json_text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body.get("messages", []))


def turn(cid: str, n: int) -> list[dict[str, str]]:
    """One turn of about 300 tokens naming its conversation (``conv=...``) and itself."""
    words = " ".join(f"w{n}x{i}" for i in range(40))
    return [
        {"role": "user", "content": f"conv={cid} turn {n}: fix src/{cid}/m_{n}.py {words}"},
        {
            "role": "assistant",
            "content": f"conv={cid} turn {n}: updated src/{cid}/m_{n}.py {words}",
        },
    ]


def load(engine: Engine, broker_url: str, ids: list[str]) -> int:
    """Add every turn from several host threads, enqueueing after each; the tasks sent."""

    def chat(cid: str) -> int:
        for n in range(FIRST_TURNS, FIRST_TURNS + ADDED_TURNS):
            service.add_many(engine, cid, turn(cid, n))
            compress_later(cid, broker_url=broker_url)
        return ADDED_TURNS

    with ThreadPoolExecutor(HOST_THREADS) as pool:
        return sum(pool.map(chat, ids))


def leases_held(engine: Engine) -> int:
    with engine.connect() as connection:
        held = connection.execute(
            select(func.count()).where(CONVERSATIONS.c.lease_owner.is_not(None))
        ).scalar()
    return int(held or 0)


def duplicates(engine: Engine, *columns: str) -> int:
    """Summaries beyond the first sharing these columns within their conversation."""
    s = SUMMARIES.c
    groups = (
        select(func.count().label("n"))
        .select_from(SUMMARIES)
        .group_by(s.conversation_id, *(s[c] for c in columns))
    )
    with engine.connect() as connection:
        extra = connection.execute(select(func.coalesce(func.sum(groups.subquery().c.n - 1), 0)))
        return int(extra.scalar() or 0)


def lost_messages(engine: Engine, ids: list[str]) -> int:
    lost = 0
    for cid in ids:
        expected = [m["content"] for n in range(FIRST_TURNS + ADDED_TURNS) for m in turn(cid, n)]
        exported = service.export_conversation(engine, cid)["messages"]
        stored = [m.get("content") for m in exported if m.get("role") in ("user", "assistant")]
        lost += len(expected) - sum(1 for a, b in zip(expected, stored, strict=False) if a == b)
    return lost


@pytest.mark.parametrize(
    "broker",
    ["redis", pytest.param("rabbitmq", marks=pytest.mark.slow)],  # suite time: one broker
)
def test_two_worker_processes_share_one_queue_under_load(
    broker: str, tmp_path: Path, postgres_url: str, request: pytest.FixtureRequest
) -> None:
    """Two `recap worker` processes, 120 enqueues over 12 conversations from 4 host threads:
    single flight, one summary per cutoff, leases all let go, nothing lost, both served."""
    url = postgres_url
    with broker_for(broker, request) as broker_url:
        server = LLMServer(default=InFlight()).start()
        inflight = server.default
        assert isinstance(inflight, InFlight)
        env = worker_env(
            RECAP_DATABASE_URL=url,
            RECAP_BROKER_URL=broker_url,
            RECAP_SUMMARY_MODEL="openai/stand-in",
            RECAP_SUMMARY_API_BASE=server.url,
            RECAP_SUMMARY_API_KEY="test-key",
            RECAP_SUMMARY_MAX_OUTPUT_TOKENS="500",
            RECAP_OUTPUT_DIR=str(tmp_path / "outputs"),
        )
        args = ("--queues", "compress", "--concurrency", str(WORKER_THREADS))
        workers = [WorkerProcess(env, tmp_path / f"w{n}.log", args=args) for n in (1, 2)]
        engine = make_engine(url)
        ids = [f"s{n:02d}" for n in range(CONVERSATIONS_UNDER_LOAD)]
        try:
            for worker in workers:  # they start (seconds) while the database is made ready
                worker.launch()
            upgrade(engine)
            records = [
                {"id": cid, "messages": [m for n in range(FIRST_TURNS) for m in turn(cid, n)]}
                for cid in ids
            ]
            service.import_conversations(engine, records, get_settings(), max_input_tokens=WINDOW)
            for worker in workers:
                worker.wait_ready(1)
            started = time.monotonic()
            sent = load(engine, broker_url, ids)

            def runs() -> int:
                return sum(task_runs(w.text(), "recap.compress_session") for w in workers)

            wait_for(
                lambda: runs() >= sent and not leases_held(engine),
                DRAIN_TIMEOUT,
                f"{sent} compressions",
                workers[0].log,
            )
            served = [task_runs(w.text(), "recap.compress_session") for w in workers]
            print(f"{sent} tasks served {served} in {time.monotonic() - started:.1f} s")
        finally:
            stop_workers(workers)
            server.stop()
        with engine.connect() as connection:
            summaries = connection.execute(select(func.count()).select_from(SUMMARIES)).scalar()
            overtaken = connection.execute(
                select(func.count()).where(LOG.c.reason.like("%by another run%"))
            ).scalar()
        assert summaries and summaries >= len(ids), summaries  # the load made summaries
        assert max(inflight.peak.values()) == 1, inflight.peak  # single flight
        assert duplicates(engine, "previous_summary_id") == 0
        assert duplicates(engine, "cutoff_message_id") == 0
        assert overtaken == 0
        assert leases_held(engine) == 0
        assert lost_messages(engine, ids) == 0
        assert all(served), served  # both processes took tasks from the one queue
        engine.dispose()


@contextmanager
def broker_for(broker: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis server of the test's own, or a fresh vhost on the test run's RabbitMQ node."""
    if broker == "rabbitmq":
        try:
            yield str(request.getfixturevalue("amqp_url"))
        finally:
            reset()
        return
    need_redis_server()
    with RedisServer.started() as server:
        try:
            yield server.url
        finally:
            reset()
