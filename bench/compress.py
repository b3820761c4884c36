"""compress_session: what the summarizer is sent, worker throughput, connections during calls.

- ``summarizer_input_vs_conversation``: every shared conversation replayed turn by turn (a run
  before each assistant message, as a host enqueues after each turn) at a 12,000-token window,
  the local OpenAI-compatible server standing in for the model; tokens sent to the summarizer
  over the tokens of the conversations that needed a summary. Progressive summaries keep it
  near 1; re-summarizing the whole history each time would grow with the square of the length.
- ``compress_throughput_vs_ideal``: 64 compressions on a real worker (Redis broker, threads
  pool, concurrency 16) against a model that answers in 1 s; throughput over the ideal 16/s.
- ``db_connections_during_model_calls``: the most database connections the calling thread held
  when a model request went out (both runs above).
- ``identifier_retention_extractive``: the mean retention score of the offline summarizer over
  the same replay.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import Figure
from bench.data import load_all
from bench.services import REDIS_URL
from tests.support.processes import wait_for
from tests.support.worker_stack import CELERY, WorkerProcess, worker_env

WINDOW = 12_000  # the replay's context window
STAND_IN_MODEL = "openai/gpt-4o-mini"  # a known window for the summarizer; the server answers
THROUGHPUT_RUNS = 64
THROUGHPUT_CONCURRENCY = 16
MODEL_SECONDS = 1.0
THROUGHPUT_WINDOW = 3_000  # small synthetic conversations, each over its trigger
POLL_SECONDS = 0.05  # how often the throughput run reads the log for finished runs
WORKER_START_SECONDS = 120  # a worker process imports litellm before its first task
CONNECTIONS_MODEL_SECONDS = 0.3  # the concurrent connection check only needs overlapping calls


class ThreadConnections:
    """Checked-out connections per thread, from the pool's checkout and checkin events, and the
    most any thread held at the moment it sent a model request (a litellm pre-call hook)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.worst = 0
        self.calls = 0
        self.lock = threading.Lock()

    def watch(self, engine: Any) -> None:
        from sqlalchemy import event

        event.listen(engine, "checkout", lambda *_: self._move(1))
        event.listen(engine, "checkin", lambda *_: self._move(-1))

    def _move(self, step: int) -> None:
        self.local.out = getattr(self.local, "out", 0) + step

    def at_call(self) -> None:
        with self.lock:
            self.calls += 1
            self.worst = max(self.worst, getattr(self.local, "out", 0))


@contextmanager
def pre_call_hook(connections: ThreadConnections) -> Iterator[None]:
    """Run ``connections.at_call`` in the calling thread just before each litellm request."""
    from recap.workers import llm  # noqa: F401  (first: it sets up litellm's offline price map)

    import litellm  # isort: skip
    from litellm.integrations.custom_logger import CustomLogger  # isort: skip

    class Hook(CustomLogger):  # type: ignore[misc]  # litellm: not followed by mypy
        def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
            connections.at_call()

    hook = Hook()
    litellm.callbacks.append(hook)
    try:
        yield
    finally:
        litellm.callbacks.remove(hook)


def quiet_logs() -> None:
    """Compression events go to stderr, warnings only: stdout is the benchmark's JSON."""
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="WARNING", force=True)


# --- the replay --------------------------------------------------------------------------------


def replay(
    folder: Path, summary_model: str | None, server: Any, connections: ThreadConnections
) -> dict[str, Any]:
    """Import every shared conversation at the replay window, then run compress_session at each
    point a request would be sent (the leaf before every assistant message, and the last)."""
    from sqlalchemy import select

    from recap.core import service
    from recap.core.settings import load_settings
    from recap.core.storage.db import make_engine, session_scope
    from recap.core.storage.migrate import upgrade
    from recap.core.storage.models import SUMMARIES
    from recap.workers.compress import compress_session

    kind = "model" if summary_model else "extractive"
    url = f"sqlite:///{folder / f'replay-{kind}.db'}"
    settings = load_settings(
        database_url=url,
        summary_model=summary_model,
        summary_api_base=server.url if server else None,
        summary_api_key="bench" if server else None,
        output_dir=folder / "outputs",
    )
    engine = make_engine(url)
    upgrade(engine)
    connections.watch(engine)
    records = [{**r, "id": f"{i}:{r.get('id', '')}"} for i, r in enumerate(load_all())]
    service.import_conversations(engine, records, settings, max_input_tokens=WINDOW)
    per_conversation: dict[str, int] = {}
    actions: dict[str, int] = {}
    for record in records:
        exported = service.export_conversation(engine, record["id"])["messages"]
        leaves = [
            exported[i - 1]["id"] for i, m in enumerate(exported) if i and m["role"] == "assistant"
        ]
        sent_before = len(server.requests) if server else 0
        for leaf in [*leaves, exported[-1]["id"]]:
            outcome = compress_session(engine, settings, record["id"], leaf)
            actions[outcome["action"]] = actions.get(outcome["action"], 0) + 1
        if server:
            per_conversation[record["id"]] = len(server.requests) - sent_before
    with session_scope(engine) as session:
        rows = session.connection().execute(select(SUMMARIES.c.identifier_retention))
        scores = [float(row[0]) for row in rows]
        counts = _conversation_tokens(session)
    engine.dispose()
    return {"actions": actions, "scores": scores, "tokens": counts, "requests": per_conversation}


def _conversation_tokens(session: Any) -> dict[str, int]:
    from sqlalchemy import func, select

    from recap.core.storage.models import MESSAGES

    statement = select(MESSAGES.c.conversation_id, func.sum(MESSAGES.c.tokens)).group_by(
        MESSAGES.c.conversation_id
    )
    return {str(cid): int(total) for cid, total in session.connection().execute(statement)}


def summarizer_figures(folder: Path, connections: ThreadConnections) -> list[Figure]:
    from recap.core.counting import tokens
    from tests.support.llm_server import LLMServer

    server = LLMServer().start()
    try:
        with pre_call_hook(connections):
            model_run = replay(folder, STAND_IN_MODEL, server, connections)
        requests = list(server.requests)
    finally:
        server.stop()
    sent_tokens: dict[str, int] = {}
    order = [cid for cid, n in model_run["requests"].items() for _ in range(n)]
    for cid, request in zip(order, requests, strict=True):
        count = tokens.count_messages(request.messages, tokens.O200K)
        sent_tokens[cid] = sent_tokens.get(cid, 0) + count
    summarized = [cid for cid, n in sent_tokens.items() if n > 0]
    total_sent = sum(sent_tokens[cid] for cid in summarized)
    total_conversation = sum(model_run["tokens"][cid] for cid in summarized)
    worst = max((sent_tokens[cid] / model_run["tokens"][cid] for cid in summarized), default=0)
    extractive_run = replay(folder, None, None, connections)
    scores = extractive_run["scores"]
    return [
        Figure(
            "summarizer_input_vs_conversation",
            round(total_sent / total_conversation, 3) if total_conversation else 0.0,
            "<= 1.5",
            f"tokens sent to the summarizer over the tokens of the {len(summarized)} shared "
            f"conversations that needed a summary at a {WINDOW:,}-token window, replayed turn by "
            f"turn ({len(requests)} summarizer calls, runs: {model_run['actions']})",
        ),
        Figure(
            "summarizer_input_vs_conversation_worst",
            round(worst, 3),
            "",
            "the same ratio for the conversation where it is highest",
        ),
        Figure(
            "identifier_retention_extractive",
            round(sum(scores) / len(scores), 3) if scores else 0.0,
            "",
            f"mean identifier-retention score of the {len(scores)} offline extractive summaries "
            "written in the same replay without a model",
        ),
    ]


# --- throughput --------------------------------------------------------------------------------


@contextmanager
def bench_env(values: dict[str, str]) -> Iterator[None]:
    """Environment settings for one run, restored afterwards (settings re-read both times)."""
    from recap.core.settings import get_settings

    saved = {key: os.environ.get(key) for key in [*values, "RECAP_RESULT_BACKEND"]}
    os.environ.pop("RECAP_RESULT_BACKEND", None)  # no results kept: completion is read from the log
    os.environ.update(values)
    get_settings.cache_clear()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        get_settings.cache_clear()


def prepared(url: str, count: int, tag: str) -> tuple[Any, list[str]]:
    """A migrated database holding ``count`` synthetic conversations, each over its trigger."""
    from recap.core import service
    from recap.core.settings import get_settings
    from recap.core.storage.db import get_engine
    from recap.core.storage.migrate import upgrade

    engine = get_engine(url)
    upgrade(engine)
    ids = [f"{tag}{i}" for i in range(count)]
    records = [{"id": cid, "messages": synthetic_chat(cid)} for cid in ids]
    service.import_conversations(
        engine, records, get_settings(), max_input_tokens=THROUGHPUT_WINDOW
    )
    return engine, ids


def throughput_figure(folder: Path) -> Figure:
    """64 compressions on a worker process of its own (threads pool, concurrency 16, Redis)."""
    from recap.core.settings import get_settings
    from recap.workers.app import app
    from recap.workers.enqueue import CompressJob, send
    from tests.support.celery_helpers import configured_app
    from tests.support.services import redis_database

    server = model_process(MODEL_SECONDS)
    try:
        with redis_database(REDIS_URL) as broker:  # no other run's messages, nobody flushes it
            values = model_env(folder, "throughput.db", broker, server)
            values["RECAP_LOG_LEVEL"] = "WARNING"  # a line per task at INFO is not measured here
            worker = worker_process(folder, values)
            with bench_env(values), configured_app(get_settings(), None):
                engine, ids = prepared(values["RECAP_DATABASE_URL"], THROUGHPUT_RUNS + 1, "t")
                try:
                    worker.launch()
                    send(app, CompressJob(ids[0]))  # warm-up: not timed
                    wait_for_runs(engine, 1, timeout=WORKER_START_SECONDS, log=worker.log)
                    started = time.perf_counter()
                    for cid in ids[1:]:
                        send(app, CompressJob(cid))
                    actions = wait_for_runs(engine, len(ids), log=worker.log)
                    elapsed = time.perf_counter() - started
                finally:
                    worker.stop()
    finally:
        server.terminate()
        server.wait()
    done = actions.count("summarized") - 1  # the warm-up run is not timed
    ideal = THROUGHPUT_CONCURRENCY / MODEL_SECONDS
    return Figure(
        "compress_throughput_vs_ideal",
        round((done / elapsed) / ideal, 3),
        ">= 0.8",
        f"{done} of {THROUGHPUT_RUNS} compressions summarized in {elapsed:.2f} s by a worker "
        f"process (`celery -A recap.workers.app worker -P threads -c "
        f"{THROUGHPUT_CONCURRENCY}`, Redis broker, SQLite), the model answering in "
        f"{MODEL_SECONDS:g} s; throughput over the ideal {ideal:g} per second",
    )


def concurrent_connections(folder: Path, connections: ThreadConnections) -> None:
    """16 compressions at once on an in-process worker, every model request checked for the
    connections its thread held (the pre-call hook), to go with the sequential replay's."""
    from celery.contrib.testing.worker import start_worker

    from recap.core.settings import get_settings
    from recap.workers.app import app
    from recap.workers.enqueue import CompressJob, send
    from tests.support.celery_helpers import configured_app

    server = model_process(CONNECTIONS_MODEL_SECONDS)
    values = model_env(folder, "connections.db", REDIS_URL, server)
    with bench_env(values):
        try:
            engine, ids = prepared(values["RECAP_DATABASE_URL"], THROUGHPUT_CONCURRENCY, "k")
            connections.watch(engine)
            with (
                configured_app(get_settings(), prefix=f"bench-{uuid.uuid4().hex[:8]}:"),
                pre_call_hook(connections),
                start_worker(
                    app,
                    pool="threads",
                    concurrency=THROUGHPUT_CONCURRENCY,
                    perform_ping_check=False,
                    loglevel="WARNING",
                    shutdown_timeout=60,
                ),
            ):
                quiet_logs()
                for cid in ids:
                    send(app, CompressJob(cid))
                wait_for_runs(engine, len(ids))
        finally:
            server.terminate()
            server.wait()


def stand_in_env(folder: Path, database_url: str, broker: str, api_base: str) -> dict[str, str]:
    """A worker's settings for a run against the stand-in model server at ``api_base``."""
    return {
        "RECAP_DATABASE_URL": database_url,
        "RECAP_BROKER_URL": broker,
        "RECAP_SUMMARY_MODEL": STAND_IN_MODEL,
        "RECAP_SUMMARY_API_BASE": api_base,
        "RECAP_SUMMARY_MAX_OUTPUT_TOKENS": "500",
        "RECAP_SUMMARY_API_KEY": "bench",
        "RECAP_OUTPUT_DIR": str(folder / "outputs"),
    }


def model_env(
    folder: Path, database: str, broker: str, server: subprocess.Popen[bytes]
) -> dict[str, str]:
    """Settings for a run against the model server process (its first output line is its URL)."""
    api_base = str(server.stdout.readline().decode().strip())  # type: ignore[union-attr]
    return stand_in_env(folder, f"sqlite:///{folder / database}", broker, api_base)


def worker_process(folder: Path, values: dict[str, str]) -> WorkerProcess:
    """``celery -A recap.workers.app worker`` with the threads pool, as deployed for compression."""
    args: tuple[str, ...] = ("-P", "threads", "-c", str(THROUGHPUT_CONCURRENCY), "-Q", "compress")
    args += ("--loglevel", "WARNING")
    env = worker_env(**values)
    return WorkerProcess(env, folder / "worker.log", args=args, program=CELERY)


def wait_for_runs(
    engine: Any, count: int, timeout: float = 120, log: Path | None = None
) -> list[str]:
    """Poll the compaction log until ``count`` runs are recorded; their actions (a
    ``TimeoutError`` quoting ``log``'s tail if they are not, in time)."""
    from sqlalchemy import select

    from recap.workers.compress import COMPACTION_LOG

    def actions() -> list[str]:
        with engine.connect() as connection:
            rows = connection.execute(  # consecutive skips share a row: its repeats count
                select(COMPACTION_LOG.c.action, COMPACTION_LOG.c.repeats)
            )
            found = [str(a) for a, repeats in rows for _ in range(int(repeats))]
        return found if len(found) >= count else []

    return list(wait_for(actions, timeout, f"{count} runs", log, poll=POLL_SECONDS))


def model_process(delay: float) -> subprocess.Popen[bytes]:
    """The local model server in a process of its own, as a real model is: its work does not
    compete with the worker's threads. Its first output line is its URL."""
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "tests.support.llm_server", "--delay", str(delay)]
    return subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE)


PROSE = (
    "The change keeps the public interface as it is and moves the parsing into a helper, so the "
    "caller no longer needs to know about the file format. I ran the focused tests first and "
    "then the whole suite; the remaining failure comes from the fixture that still expects the "
    "old error message, which we agreed to update in the same commit. Next I will check the "
    "two call sites that build their own readers, since they bypass the helper, and add a case "
    "for an empty input, which used to return None instead of raising."
)


def synthetic_chat(tag: str) -> list[dict[str, str]]:
    """Twelve turns of prose naming a file, a test and an error, about 125 tokens per message:
    over the trigger of a 3,000-token window."""
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    for n in range(12):
        ask = f"Please fix src/{tag}/parser_{n}.py: test_parse_{n} fails with ValueError. "
        done = f"Updated src/{tag}/parser_{n}.py and ran `pytest -k test_parse_{n}`. "
        messages.append({"role": "user", "content": ask + PROSE})
        messages.append({"role": "assistant", "content": done + PROSE})
    return messages


def run() -> list[Figure]:
    quiet_logs()
    connections = ThreadConnections()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        figures = summarizer_figures(folder, connections)
        concurrent_connections(folder, connections)
        figures.append(throughput_figure(folder))
    figures.append(
        Figure(
            "db_connections_during_model_calls",
            float(connections.worst),
            "== 0",
            f"the most database connections the calling thread held when one of "
            f"{connections.calls} model requests went out (replay and throughput runs)",
        )
    )
    return figures
