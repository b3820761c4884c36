"""Workers survive broker and database restarts, and ``recap worker`` restarts a child that dies.

Every server here is the test's own: a ``redis-server`` on a free port and a PostgreSQL cluster
made with ``initdb`` (as the ``postgres`` user when the tests run as root), restarted and stopped
by their pids; the shared servers are never touched. ``Stack`` and ``stack_on`` take any broker
with a URL and a ``restart()``: ``tests/test_rabbitmq.py`` runs the same worker on a RabbitMQ
node of its own. The worker is a real ``recap worker``
process calling the local model server through litellm; the model's reply is held (``Gate``)
while a server restarts, so "during the model call" and "during the write" need no sleeps.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import structlog
from kombu import Connection, Consumer, Exchange, Producer, Queue
from sqlalchemy import Engine, select

from recap.core import service
from recap.core.settings import get_settings
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import CONVERSATIONS, CompactionLog, table_of
from recap.workers import patches
from recap.workers.enqueue import compress_later, reset
from recap.workers.runner import RestartPolicy, Supervisor
from tests.support.llm_server import LLMServer
from tests.support.services import (
    PostgresCluster,
    RedisServer,
    missing_postgres,
    need_redis_server,
    need_service,
)
from tests.support.worker_stack import Gate, WorkerProcess, wait_for, worker_env

WINDOW = 3_000  # small, so a dozen short turns go over the trigger
TURNS = 12
SUMMARY_TIMEOUT = 60.0  # a compression after a restart: reconnects, retries, a model call
LOG = table_of(CompactionLog)


# --- the supervisor's policy and loop ----------------------------------------------------------


@pytest.mark.parametrize(
    ("fast_deaths", "delay"),
    [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0), (6, None)],
)
def test_restart_delay_doubles_then_gives_up(fast_deaths: int, delay: float | None) -> None:
    """A child that ran a while restarts at once; fast deaths double the wait; six give up."""
    assert RestartPolicy().delay(fast_deaths) == delay


def test_restart_delay_is_capped() -> None:
    """The doubling stops at the policy's maximum."""
    policy = RestartPolicy(first_delay=10, max_delay=25, max_fast_deaths=10)
    assert [policy.delay(n) for n in (1, 2, 3, 9)] == [10, 20, 25, 25]


def test_a_child_that_keeps_dying_is_restarted_then_given_up_on() -> None:
    """Real child processes that exit at once: restarted with backoff, logged, and after the
    allowed number of fast deaths the supervisor exits with the child's code."""
    policy = RestartPolicy(first_delay=0.01, max_delay=0.05, fast_seconds=60, max_fast_deaths=3)
    command = [sys.executable, "-c", "raise SystemExit(3)"]
    with structlog.testing.capture_logs() as logs:
        code = Supervisor(commands={"broken": command}, policy=policy).run()
    assert code == 3
    events = [entry["event"] for entry in logs]
    assert events.count("worker_child_started") == 4  # the first start and three restarts
    assert events.count("worker_child_died") == 3
    assert events[-1] == "worker_child_gave_up"


# --- kombu's detached-transport crash (workers/patches.py) -------------------------------------


def _close_after_redis_went_away(redis_server: RedisServer) -> None:
    """What a worker's consumer does when Redis goes away: its channel holds a delivered,
    unacknowledged task, waits in BRPOP for the next one and has an auto-delete fanout queue
    (Celery's remote control); Celery then calls ``collect()`` and ``close()``."""
    connection = Connection(redis_server.url)
    channel = connection.default_channel
    name = f"patch-{uuid.uuid4().hex[:6]}"
    tasks = Queue(name, Exchange(name, type="direct"), routing_key=name)
    control = Queue(f"{name}-control", Exchange(f"{name}-control", type="fanout"), auto_delete=True)
    Producer(channel).publish({"n": 1}, exchange=tasks.exchange, routing_key=name, declare=[tasks])
    delivered: list[Any] = []
    Consumer(channel, [tasks, control], callbacks=[lambda _b, m: delivered.append(m)]).consume()
    connection.drain_events(timeout=5)
    assert len(delivered) == 1  # delivered, not acknowledged
    channel._brpop_start()  # waiting for the next task, as the worker's event loop does
    redis_server.stop()
    try:
        connection.collect()
        connection.close()
    finally:
        redis_server.start()


def test_without_the_patch_kombu_crashes_closing_a_detached_channel(
    private_redis: RedisServer,
) -> None:
    """The upstream failure itself: collect() then close() with an unacked message raises the
    AttributeError that made Celery exit (so the patch is still needed with this kombu)."""
    patches.remove()
    try:
        with pytest.raises(AttributeError, match="hostname"):
            _close_after_redis_went_away(private_redis)
    finally:
        assert patches.apply()


def test_with_the_patch_closing_a_detached_channel_is_a_connection_error(
    private_redis: RedisServer,
) -> None:
    """With the patch the same sequence ends quietly (kombu swallows connection errors)."""
    assert patches.apply()
    _close_after_redis_went_away(private_redis)


# --- a real recap worker -----------------------------------------------------------------------


def chat(turns: int, tag: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    for n in range(turns):
        for role in ("user", "assistant"):
            words = " ".join(f"{role}{n}{tag}word{i}" for i in range(30))
            messages.append({"role": role, "content": f"[{role} {n}] file src/m_{n}.py {words}"})
    return messages


class Broker(Protocol):
    """A broker server of the test's own: where it is, and a restart."""

    @property
    def url(self) -> str: ...

    def restart(self) -> None: ...


@dataclass
class Stack:
    """A worker, its broker, its database and its model, as one test sees them."""

    engine: Engine
    broker: Broker
    worker: WorkerProcess
    gate: Gate
    server: LLMServer
    cluster: PostgresCluster | None = None

    def new(self) -> str:
        cid = f"r-{uuid.uuid4().hex[:8]}"
        conversation = {"id": cid, "messages": chat(TURNS, cid)}
        service.import_conversations(
            self.engine, [conversation], get_settings(), max_input_tokens=WINDOW
        )
        return cid

    def enqueue(self, cid: str) -> str:
        return compress_later(cid, broker_url=self.broker.url)

    def summaries(self, cid: str) -> int:
        return len(service.list_summaries(self.engine, cid))

    def wait_summary(self, cid: str) -> None:
        wait_for(lambda: self.summaries(cid) >= 1, SUMMARY_TIMEOUT, f"a summary of {cid}", self.log)

    def wait_model_call(self, count: int) -> None:
        wait_for(lambda: self.gate.arrived >= count, SUMMARY_TIMEOUT, "the model call", self.log)

    @property
    def log(self) -> Path:
        return self.worker.log

    def actions(self, cid: str) -> list[str]:
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(LOG.c.action).where(LOG.c.conversation_id == cid).order_by(LOG.c.id)
            )
            return [str(action) for (action,) in rows]

    def lease_owner(self, cid: str) -> str | None:
        with self.engine.connect() as connection:
            c = CONVERSATIONS.c
            return connection.execute(select(c.lease_owner).where(c.id == cid)).scalar()

    def assert_one_summary_and_free(self, cid: str) -> None:
        assert self.summaries(cid) == 1
        assert self.actions(cid).count("summarized") == 1, self.actions(cid)
        assert self.lease_owner(cid) is None

    def served_after(self) -> None:
        """A conversation enqueued now is served: the worker is up and consuming."""
        later = self.new()
        self.enqueue(later)
        self.wait_summary(later)
        assert self.worker.alive


def _worker(
    tmp: Path, database_url: str, broker: Broker, server: LLMServer, args: tuple[str, ...]
) -> WorkerProcess:
    env = worker_env(
        RECAP_DATABASE_URL=database_url,
        RECAP_BROKER_URL=broker.url,
        RECAP_SUMMARY_MODEL="openai/stand-in",
        RECAP_SUMMARY_API_BASE=server.url,
        RECAP_SUMMARY_API_KEY="test-key",
        RECAP_RETRY_BACKOFF_MAX="1",
        RECAP_MAX_ATTEMPTS="6",
        RECAP_OUTPUT_DIR=str(tmp / "outputs"),
    )
    return WorkerProcess(env, tmp / "worker.log", args=args)


@contextmanager
def stack_on(
    broker: Broker,
    tmp: Path,
    database_url: str,
    cluster: PostgresCluster | None = None,
    worker_args: tuple[str, ...] = ("--queues", "compress"),
    prepare: Callable[[], None] | None = None,
) -> Iterator[Stack]:
    """A `recap worker` on this broker and database, calling a gated model server. The worker
    starts (seconds: it imports litellm) while ``prepare()`` makes the database and the schema
    is migrated; it reads neither before its first task."""
    gate = Gate()
    server = LLMServer(default=gate).start()
    worker = _worker(tmp, database_url, broker, server, worker_args).launch()
    engine: Engine | None = None
    try:
        if prepare is not None:
            prepare()
        engine = make_engine(database_url)
        upgrade(engine)
        worker.wait_ready(1)
        yield Stack(engine, broker, worker, gate, server, cluster)
    finally:
        gate.open()
        worker.stop()
        reset()
        server.stop()
        if engine is not None:
            engine.dispose()


@contextmanager
def _redis_stack(
    tmp: Path,
    database_url: str,
    cluster: PostgresCluster | None,
    prepare: Callable[[], None] | None = None,
) -> Iterator[Stack]:
    need_redis_server()
    with (
        RedisServer.started() as broker,
        stack_on(broker, tmp, database_url, cluster, prepare=prepare) as stack,
    ):
        yield stack


@pytest.fixture(scope="module")
def redis_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A worker on SQLite and a Redis of its own (restarted by the tests)."""
    tmp = tmp_path_factory.mktemp("redis-stack")
    with _redis_stack(tmp, f"sqlite:///{tmp / 'recap.db'}", None) as stack:
        yield stack


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A worker on a PostgreSQL cluster of its own (restarted and stopped by the tests); the
    cluster is made (initdb) while the worker starts."""
    problem = missing_postgres()
    if problem is not None:
        need_service("PostgreSQL (initdb and pg_ctl)", problem)
    tmp = tmp_path_factory.mktemp("pg-stack")
    cluster = PostgresCluster()

    def database() -> None:
        cluster.start()
        cluster.create_database("recap")

    try:
        with _redis_stack(tmp, cluster.url("recap"), cluster, prepare=database) as stack:
            yield stack
    finally:
        cluster.remove()


def held_run(stack: Stack) -> str:
    """A conversation over its trigger whose compression is now waiting on the model."""
    cid = stack.new()
    before = stack.gate.arrived
    stack.gate.arm()
    stack.enqueue(cid)
    stack.wait_model_call(before + 1)
    return cid


def test_a_redis_restart_during_the_model_call_keeps_the_worker(redis_stack: Stack) -> None:
    """Redis restarts while the model answers: the same worker child finishes the run (one
    summary, the lease let go), reconnects, and serves a task enqueued after the restart."""
    s = redis_stack
    children = s.worker.children()
    cid = held_run(s)
    s.broker.restart()
    s.gate.open()
    s.wait_summary(cid)
    s.served_after()
    s.assert_one_summary_and_free(cid)
    assert s.worker.children() == children, s.worker.text()[-3000:]
    assert "Unrecoverable error" not in s.worker.text()


def test_a_dead_worker_child_is_restarted_by_recap_worker(redis_stack: Stack) -> None:
    """SIGKILL the compress child: the supervisor logs it, starts a new one, which serves."""
    s = redis_stack
    (child,) = s.worker.children()
    starts = s.worker.text().count(" ready.")
    os.kill(child, signal.SIGKILL)
    s.worker.wait_log("worker_child_died", timeout=30)
    s.worker.wait_ready(starts + 1)
    assert s.worker.children() not in ([], [child])
    s.served_after()


def test_a_postgres_restart_during_the_model_call(pg_stack: Stack) -> None:
    """PostgreSQL restarts while the model answers: the write reconnects, one summary, the
    lease let go, and the worker serves what comes next."""
    s = pg_stack
    assert s.cluster is not None
    cid = held_run(s)
    s.cluster.restart()
    s.gate.open()
    s.wait_summary(cid)
    s.assert_one_summary_and_free(cid)
    s.served_after()


def test_postgres_down_through_the_write_keeps_the_summary_and_retries(pg_stack: Stack) -> None:
    """PostgreSQL is down when the model's summary arrives: the write is retried with backoff
    (no second model call), lands once the database is back, and the lease is let go."""
    s = pg_stack
    assert s.cluster is not None
    retries = s.worker.text().count("database_unavailable_retrying")
    cid = held_run(s)
    s.cluster.stop()
    s.gate.open()
    s.worker.wait_log("database_unavailable_retrying", timeout=30, count=retries + 1)
    calls = s.gate.arrived
    s.cluster.start()
    s.wait_summary(cid)
    assert s.gate.arrived == calls  # the paid summary was kept, not asked for again
    s.assert_one_summary_and_free(cid)
    s.served_after()


def test_a_read_while_postgres_is_down_is_retried_by_celery(pg_stack: Stack) -> None:
    """The database is down when the task starts: Celery retries it with backoff, and it
    completes once the database is back (not lost, not failed)."""
    s = pg_stack
    assert s.cluster is not None
    cid = s.new()
    seen = s.worker.text().count("the database is unavailable")
    s.cluster.stop()
    try:
        s.enqueue(cid)
        s.worker.wait_log("the database is unavailable", timeout=30, count=seen + 1)
    finally:
        s.cluster.start()
    s.wait_summary(cid)
    s.assert_one_summary_and_free(cid)
    assert "failed" not in s.actions(cid)


# --- what counts as "the database is unavailable" ----------------------------------------------


def _error_of(url: str, statement: str) -> Exception:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text(statement))
    except Exception as exc:  # the error itself is what the test looks at
        return exc
    finally:
        engine.dispose()
    raise AssertionError(f"{statement!r} did not fail")


def test_database_unavailable_tells_a_missing_server_from_a_bad_statement(tmp_path: Path) -> None:
    """A refused connection is retried; a missing table, bad SQL or a constraint is not."""
    from recap.core.compression.dbretry import database_unavailable
    from tests.support.processes import free_port

    sqlite = f"sqlite:///{tmp_path / 'x.db'}"
    refused = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none?connect_timeout=2"
    cases = [
        (_error_of(refused, "select 1"), True),
        (_error_of(sqlite, "select * from no_table"), False),
        (_error_of(sqlite, "selec 1"), False),
        (ValueError("not a database error"), False),
    ]
    for exc, expected in cases:
        assert database_unavailable(exc) is expected, exc
