"""compress_session on a real Celery worker, a real broker and a real database, with litellm
calling the local OpenAI-compatible server over HTTP.

The broker is Redis, and RabbitMQ too for a core of the tests (``tests.support.brokers``: a summary
lands, one summary under concurrent enqueues, retries, a worker killed mid-call). On Redis each
test gets its own key prefix, so runs sharing the server do not see each other's messages (the
worker-kill test's child workers use a Redis database of their own); on RabbitMQ each test has a
vhost of its own.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from kombu import Connection
from sqlalchemy import Engine, event, select, text, update

from recap.core import service
from recap.core.settings import Settings, get_settings
from recap.core.storage import lease
from recap.core.storage.db import get_engine, make_engine, session_scope
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import (
    CONVERSATIONS,
    MESSAGES,
    SUMMARIES,
    CompactionLog,
    table_of,
    utcnow,
)
from recap.core.summaries.prompts import CUTOFF_MARKER, NO_PREVIOUS_SUMMARY, SUMMARY_MESSAGE_PREFIX
from recap.workers.app import app, is_redis
from recap.workers.errors import CompressionFailed
from tests.support.brokers import (
    broker_url_for,
    result_backend_for,
    stop_promptly,
)
from tests.support.celery_helpers import configured_app
from tests.support.cli_helpers import assert_one_line_error, recap
from tests.support.llm_server import LLMServer, Reply
from tests.support.processes import wait_for
from tests.support.services import redis_database
from tests.support.worker_stack import CELERY, WorkerProcess

pytestmark = pytest.mark.redis

WINDOW = 3_000  # small, so a dozen short turns go over the trigger (2,137 tokens)
TURN_WORDS = 30  # about 150 tokens per message
RESULT_TIMEOUT = 60
LOG = table_of(CompactionLog)


# --- helpers -----------------------------------------------------------------------------------


def turn_text(role: str, n: int, tag: str = "") -> str:
    """A message of about 150 tokens that names itself, so a test can find it anywhere."""
    words = " ".join(f"{role}{n}{tag}word{i}" for i in range(TURN_WORDS))
    return f"[{role} {n}{tag}] file src/module_{n}{tag}.py {words}"


def chat(turns: int, tag: str = "") -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    for n in range(turns):
        messages.append({"role": "user", "content": turn_text("user", n, tag)})
        messages.append({"role": "assistant", "content": turn_text("assistant", n, tag)})
    return messages


class PoolWatch:
    """Counts the engine's checked-out connections through the pool's own events."""

    def __init__(self, engine: Engine) -> None:
        self.out = 0
        self.lock = threading.Lock()
        event.listen(engine, "checkout", self._checkout)
        event.listen(engine, "checkin", self._checkin)

    def _checkout(self, *_: Any) -> None:
        with self.lock:
            self.out += 1

    def _checkin(self, *_: Any) -> None:
        with self.lock:
            self.out -= 1


@dataclass
class Harness:
    engine: Engine
    server: LLMServer
    settings: Settings
    watch: PoolWatch

    def add(self, cid: str, messages: list[dict[str, str]], parent: int | None = None) -> int:
        last = 0
        for message in messages:
            last = service.add_message(self.engine, cid, message, parent_id=parent)
            parent = last
        return last

    def new(self, turns: int, cid: str | None = None, tag: str = "") -> str:
        cid = cid or f"c-{uuid.uuid4().hex[:8]}"
        service.import_conversations(
            self.engine,
            [{"id": cid, "messages": chat(turns, tag)}],
            self.settings,
            max_input_tokens=WINDOW,
        )
        return cid

    def compress(self, cid: str, **kwargs: Any) -> dict[str, Any]:
        """The task's result; a FAILURE as ``{"action": "failed", "reason": its message}``."""
        result = app.send_task("recap.compress_session", args=[cid], kwargs=kwargs)
        value = result.get(timeout=RESULT_TIMEOUT, propagate=False)
        if result.state == "FAILURE":
            assert isinstance(value, CompressionFailed), value
            return {"action": "failed", "reason": str(value)}
        return dict(value)

    def summaries(self, cid: str) -> list[dict[str, Any]]:
        return service.list_summaries(self.engine, cid)

    def log(self, cid: str) -> list[tuple[str, str]]:
        with session_scope(self.engine) as session:
            rows = session.connection().execute(
                select(LOG.c.action, LOG.c.reason)
                .where(LOG.c.conversation_id == cid)
                .order_by(LOG.c.id)
            )
            return [(str(a), str(r)) for a, r in rows]


def messages_table(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(select(MESSAGES).order_by(MESSAGES.c.id))]


@contextmanager
def harness_for(
    db_url: str, broker_url: str, monkeypatch: pytest.MonkeyPatch, **env: str
) -> Iterator[Harness]:
    """An in-process worker on ``broker_url`` (Redis or RabbitMQ) over ``db_url``, results in
    Redis, and the local model server."""
    server = LLMServer().start()
    values = {
        "RECAP_DATABASE_URL": db_url,
        "RECAP_BROKER_URL": broker_url,
        "RECAP_RESULT_BACKEND": result_backend_for(broker_url),
        "RECAP_SUMMARY_MODEL": "openai/stand-in",
        "RECAP_SUMMARY_API_BASE": server.url,
        "RECAP_SUMMARY_API_KEY": "test-key",
        "RECAP_RETRY_BACKOFF_MAX": "1",
        "RECAP_LLM_TIMEOUT": "30",
        "RECAP_MAX_ATTEMPTS": "4",
        "RECAP_SUMMARY_MAX_OUTPUT_TOKENS": "500",
        **env,
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    settings = get_settings()
    engine = get_engine(db_url)
    upgrade(engine)
    watch = PoolWatch(engine)
    server.probe = lambda: watch.out
    prefix = f"recap-test-{uuid.uuid4().hex[:10]}:"
    try:
        with (
            configured_app(settings, prefix),
            start_worker(
                app,
                pool="threads",
                concurrency=8,
                perform_ping_check=False,
                loglevel="WARNING",
                shutdown_timeout=30,
            ) as worker,
        ):
            try:
                yield Harness(engine, server, settings, watch)
            finally:
                stop_promptly(worker)
    finally:
        server.stop()


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str:
    """The worker's broker: each of Redis and RabbitMQ (``tests/support/brokers.py``)."""
    return broker_url_for(request)


@pytest.fixture
def harness(sqlite_url: str, broker: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """A worker on the broker over a fresh SQLite database, and the local model server."""
    with harness_for(sqlite_url, broker, monkeypatch) as h:
        yield h


# --- skip, summarize, the request view ---------------------------------------------------------


def test_skips_under_the_trigger_then_summarizes_over_it(harness: Harness) -> None:
    """Under the trigger no model is called; over it a summary is stored, the request then holds
    it, leaves out everything up to the cutoff and resumes at a user message, no connection is
    checked out during the call, and no message changes."""
    cid = harness.new(turns=4)
    skipped = harness.compress(cid)
    assert skipped["action"] == "skipped" and skipped["summary_id"] is None
    assert harness.server.requests == []

    harness.add(cid, chat(10, tag="b")[1:])
    before = messages_table(harness.engine)
    done = harness.compress(cid)
    assert done["action"] == "summarized", done
    assert done["tokens_after"] < done["tokens_before"]
    assert len(harness.server.requests) == 1
    assert [r.probe for r in harness.server.requests] == [0]
    assert messages_table(harness.engine) == before

    request = service.assemble(harness.engine, cid, harness.settings)
    assert request.summary_id == done["summary_id"]
    (summary,) = harness.summaries(cid)
    cutoff = summary["cutoff_message_id"]
    assert request.messages[0]["role"] == "system"
    assert request.messages[1]["content"].startswith(SUMMARY_MESSAGE_PREFIX)
    exported = service.export_conversation(harness.engine, cid)["messages"]
    covered = [m["content"] for m in exported[1:] if m["id"] <= cutoff]
    after = [m for m in exported if m["id"] > cutoff]
    sent = "\n".join(str(m["content"]) for m in request.messages[2:])
    assert covered and not any(text in sent for text in covered)
    assert after[0]["role"] == "user"
    assert request.messages[2] == {"role": "user", "content": after[0]["content"]}
    assert harness.log(cid)[-1][0] == "summarized"


def test_progressive_summary_gets_the_previous_one_and_only_newer_messages(
    harness: Harness,
) -> None:
    """The second summary's request carries the first summary in its system prompt and only the
    messages after the first cutoff."""
    cid = harness.new(turns=12)
    first = harness.compress(cid)
    assert first["action"] == "summarized"
    harness.add(cid, chat(12, tag="later")[1:])
    second = harness.compress(cid)
    assert second["action"] == "summarized"

    one, two = harness.summaries(cid)
    assert two["previous_summary_id"] == one["id"]
    request = harness.server.requests[-1]
    with session_scope(harness.engine) as session:
        first_text = (
            session.connection()
            .execute(select(SUMMARIES.c.text).where(SUMMARIES.c.id == one["id"]))
            .scalar_one()
        )
    assert first_text in request.messages[0]["content"]
    exported = service.export_conversation(harness.engine, cid)["messages"]
    older_part = "\n".join(
        str(m["content"]) for m in request.messages[1:] if m["content"] != CUTOFF_MARKER
    )
    for message in exported[1:]:
        if message["id"] <= one["cutoff_message_id"]:
            assert message["content"] not in older_part
    assert any(
        m["content"] in older_part
        for m in exported
        if one["cutoff_message_id"] < m["id"] <= two["cutoff_message_id"]
    )


def test_summaries_are_branch_aware(harness: Harness) -> None:
    """An edit before the cutoff starts fresh (no previous summary); an edit after it keeps the
    summary; each branch's request uses its own summary."""
    cid = harness.new(turns=12)
    first = harness.compress(cid)
    cutoff = first["cutoff_message_id"]
    exported = service.export_conversation(harness.engine, cid)["messages"]
    main_leaf = exported[-1]["id"]

    early_user = exported[3]  # a user message well before the cutoff
    assert early_user["role"] == "user" and early_user["id"] < cutoff
    edited_leaf = harness.add(cid, chat(12, tag="edit")[1:], parent=early_user["id"] - 1)
    edited = harness.compress(cid, leaf_message_id=edited_leaf)
    assert edited["action"] == "summarized"
    assert NO_PREVIOUS_SUMMARY in harness.server.requests[-1].messages[0]["content"]

    late_leaf = harness.add(cid, chat(6, tag="late")[1:], parent=main_leaf - 1)
    late = harness.compress(cid, leaf_message_id=late_leaf, force=True)
    assert late["action"] == "summarized"
    one = harness.summaries(cid)[0]
    assert harness.summaries(cid)[-1]["previous_summary_id"] == one["id"]

    on_main = service.assemble(harness.engine, cid, harness.settings, leaf=main_leaf)
    on_edit = service.assemble(harness.engine, cid, harness.settings, leaf=edited_leaf)
    on_late = service.assemble(harness.engine, cid, harness.settings, leaf=late_leaf)
    assert on_main.summary_id == first["summary_id"]
    assert on_edit.summary_id == edited["summary_id"]
    assert on_late.summary_id == late["summary_id"]


# --- exactly once ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("database", "broker"),
    [("sqlite", "redis"), ("postgres", "redis"), ("postgres", "rabbitmq")],
    indirect=["broker"],
)
def test_twenty_enqueues_while_the_first_is_in_the_model_call_give_one_summary(
    database: str,
    request: pytest.FixtureRequest,
    broker: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty runs for one turn while the first waits on the model: one summary, one model call,
    the others busy (they mark the conversation dirty and the holder re-checks)."""
    db_url = str(request.getfixturevalue(f"{database}_url"))
    with harness_for(db_url, broker, monkeypatch) as h:
        cid = h.new(turns=12)
        h.server.script(Reply(hold=True))
        first = app.send_task("recap.compress_session", args=[cid])
        assert h.server.wait_for(1)
        others = [app.send_task("recap.compress_session", args=[cid]) for _ in range(19)]
        busy = [dict(r.get(timeout=RESULT_TIMEOUT)) for r in others]
        h.server.release()
        done = dict(first.get(timeout=RESULT_TIMEOUT))
        assert done["action"] == "summarized"
        assert {r["action"] for r in busy} == {"busy"}
        assert len(h.summaries(cid)) == 1
        assert len(h.server.requests) == 1
        assert [a for a, _ in h.log(cid)].count("summarized") == 1


# --- retries and failures ----------------------------------------------------------------------


def test_429_then_500_then_success_is_retried_and_stored(harness: Harness) -> None:
    """A rate limit and a server error are retried by Celery with backoff (on RabbitMQ through
    the broker's delayed delivery); the third call wins."""
    cid = harness.new(turns=12)
    harness.server.script(Reply(status=429), Reply(status=500))
    done = harness.compress(cid)
    assert done["action"] == "summarized", done
    assert len(harness.server.requests) == 3
    assert len(harness.summaries(cid)) == 1
    assert [a for a, _ in harness.log(cid)] == ["retry", "retry", "summarized"]


def test_401_is_one_call_no_retry_and_failed(harness: Harness) -> None:
    """An authentication error fails the run at once, with nothing stored."""
    cid = harness.new(turns=12)
    harness.server.script(Reply(status=401, error="invalid api key"))
    done = harness.compress(cid)
    assert done["action"] == "failed"
    assert "AuthenticationError" in done["reason"]
    assert len(harness.server.requests) == 1
    assert harness.summaries(cid) == []


def test_retries_are_bounded(harness: Harness) -> None:
    """A model that keeps failing is tried max_attempts times, then the run fails."""
    cid = harness.new(turns=12)
    harness.server.script(*[Reply(status=503)] * 10)
    done = harness.compress(cid)
    assert done["action"] == "failed" and "gave up after 4 attempts" in done["reason"]
    assert len(harness.server.requests) == harness.settings.max_attempts


@pytest.mark.parametrize(
    "reply",
    [Reply(text="   \n"), Reply(text="Error: the upstream provider is overloaded")],
)
def test_a_blank_or_error_summary_is_rejected(harness: Harness, reply: Reply) -> None:
    """A blank or error-text summary is not stored and the request view does not change."""
    cid = harness.new(turns=12)
    view = service.assemble(harness.engine, cid, harness.settings).as_dict()
    harness.server.script(reply)
    done = harness.compress(cid)
    assert done["action"] == "failed" and "rejected" in done["reason"]
    assert harness.summaries(cid) == []
    assert service.assemble(harness.engine, cid, harness.settings).as_dict() == view


def test_repeated_failures_rest_the_summarizer_until_forced(harness: Harness) -> None:
    """After RECAP_FAILURE_STREAK failed runs in a row, later runs skip without a model call
    and say until when; a forced run calls it again, and a stored summary ends the streak.
    Nine turns are over the trigger but under the urgent ratio, where the rest would not hold."""
    cid = harness.new(turns=9)
    streak = harness.settings.failure_streak
    harness.server.script(*[Reply(text="   ")] * streak)
    for _ in range(streak):
        assert harness.compress(cid)["action"] == "failed"
    calls = len(harness.server.requests)
    resting = harness.compress(cid)
    assert resting["action"] == "skipped" and "resting after 3 failed runs" in resting["reason"]
    assert "tried again after" in resting["reason"], resting
    assert len(harness.server.requests) == calls  # no model call while resting
    other = harness.new(turns=12)  # the rest is per conversation
    assert harness.compress(other)["action"] == "summarized"
    forced = harness.compress(cid, force=True)
    assert forced["action"] == "summarized", forced
    assert len(harness.server.requests) == calls + 2
    assert [a for a, _ in harness.log(cid)] == ["failed"] * streak + ["skipped", "summarized"]


def test_unknown_conversation_skips_without_a_model_call(harness: Harness) -> None:
    """A task for a conversation that is not stored (deleted, or never stored) ends skipped,
    naming it; an unknown leaf of a stored one still fails."""
    done = harness.compress("no-such-conversation")
    assert done["action"] == "skipped" and "no-such-conversation" in done["reason"]
    cid = harness.new(turns=2)
    leaf = harness.compress(cid, leaf_message_id=999_999)
    assert leaf["action"] == "failed" and "999999" in leaf["reason"]
    assert harness.server.requests == []


# --- the retention audit -----------------------------------------------------------------------


def echo_missing(body: dict[str, Any]) -> str:
    """A summary quoting the identifiers the reminder lists as missing."""
    reminder = str(body["messages"][-1]["content"])
    listed = [line[2:] for line in reminder.splitlines() if line.startswith("- ")]
    return "## Goal\n- continue\n## Relevant files\n" + "\n".join(f"- {t}" for t in listed)


def test_low_retention_asks_once_more_with_the_missing_identifiers(harness: Harness) -> None:
    """Under the floor the summarizer is asked again with the missing identifiers listed; the
    better summary is kept and its score stored."""
    cid = harness.new(turns=12)
    harness.server.default = echo_missing
    harness.server.script(Reply(text="## Goal\n- continue the work"))
    done = harness.compress(cid)
    assert done["action"] == "summarized"
    assert len(harness.server.requests) == 2
    second = harness.server.requests[1].messages[-1]["content"]
    assert "src/module_0.py" in second
    (summary,) = harness.summaries(cid)
    assert summary["identifier_retention"] >= harness.settings.identifier_retention_floor
    shown = recap("summaries", cid, "--json").json()["summaries"][0]
    assert shown["identifier_retention"] == summary["identifier_retention"]


def test_high_retention_is_not_asked_again(harness: Harness) -> None:
    """A summary over the floor is stored after one call."""
    cid = harness.new(turns=12)
    harness.server.default = lambda body: (
        "## Relevant files\n"
        + "\n".join(f"- src/module_{n}.py" for n in range(12))
        + "\n- "
        + " ".join(f"user{n}word0" for n in range(12))
    )
    done = harness.compress(cid)
    assert done["action"] == "summarized"
    assert len(harness.server.requests) == 1


# --- the run's own deadline ---------------------------------------------------------------------

SHORT_LIMIT = "5"  # RECAP_TASK_TIME_LIMIT: the run keeps a 4 s deadline, calls start with >= 2 s


def test_a_model_call_is_cut_off_at_the_runs_deadline(
    sqlite_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery enforces no time limit on the threads pool: the run keeps its own, cutting the
    model call's timeout (30 s here) to what is left of the run, and fails without a retry,
    naming the limit, well before its lease could expire."""
    with harness_for(sqlite_url, redis_url, monkeypatch, RECAP_TASK_TIME_LIMIT=SHORT_LIMIT) as h:
        cid = h.new(turns=12)
        h.server.script(Reply(hold=True))  # never answers (until the server stops)
        started = time.monotonic()
        done = h.compress(cid)
        waited = time.monotonic() - started
        assert done["action"] == "failed" and "RECAP_TASK_TIME_LIMIT" in done["reason"], done
        assert waited < h.settings.lease_seconds and waited < h.settings.llm_timeout
        assert len(h.server.requests) == 1
        assert h.summaries(cid) == []
        assert [a for a, _ in h.log(cid)] == ["failed"]


def test_a_reask_that_no_longer_fits_the_run_is_not_started(
    sqlite_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first summary under the retention floor that leaves the run too little time for a
    second call is kept as it is: the re-ask is not started, so no call is cut off half way."""
    with harness_for(sqlite_url, redis_url, monkeypatch, RECAP_TASK_TIME_LIMIT=SHORT_LIMIT) as h:
        cid = h.new(turns=12)
        h.server.default = echo_missing
        h.server.script(Reply(text="## Goal\n- continue the work", delay=2.5))
        done = h.compress(cid)
        assert done["action"] == "summarized", done
        assert len(h.server.requests) == 1
        (summary,) = h.summaries(cid)
        assert summary["identifier_retention"] < h.settings.identifier_retention_floor


# --- a worker killed mid-call ------------------------------------------------------------------


def _expire_the_lease(engine: Engine, cid: str) -> None:
    """Let the killed run's lease run out: its lifetime is the time limit plus a fixed 30 s of
    grace (``core.settings.LEASE_GRACE_SECONDS``), so its expiry is moved to now instead of
    waiting for it (``test_lease_single_flight_and_expiry`` covers expiry by the clock). The
    killed run must have held it."""
    expired = utcnow() - timedelta(seconds=1)
    with engine.begin() as connection:
        moved = connection.execute(
            update(CONVERSATIONS)
            .where(CONVERSATIONS.c.id == cid, CONVERSATIONS.c.lease_owner.is_not(None))
            .values(lease_expires_at=expired)
        )
    assert moved.rowcount == 1, "the killed run held no lease"


def _redeliver_unacked(broker: str) -> None:
    """Let Redis's visibility timeout pass for the killed run's message: kombu's own restore of
    unacknowledged messages, with a timeout of zero, puts it back on its queue. (RabbitMQ
    requeues it by itself as soon as the killed worker's connection drops.)"""
    with Connection(broker, transport_options={"visibility_timeout": 0}) as connection:
        connection.default_channel.qos.restore_visible(num=100)


def _finished(log: Path, task_id: str) -> bool:
    """Whether the worker's log has the task's closing line."""
    lines = log.read_text(errors="replace").splitlines()
    return any("task_done" in line and task_id in line for line in lines)


KILL_DEADLINE = 60.0  # from the kill to the summary, a second worker's start-up included


@pytest.mark.parametrize(
    "broker",
    ["redis", pytest.param("rabbitmq", marks=pytest.mark.slow)],  # suite time: one broker
    indirect=True,
)
def test_a_worker_killed_in_the_model_call_is_completed_once(
    tmp_path: Path, sqlite_url: str, broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL during the model call, its lease left held: once the lease has run out, a new
    worker with beat completes the conversation (reconcile every 2 s, or the broker's
    redelivery of the killed run) within a minute, and the redelivered run, which the broker
    hands out again, adds no second summary."""
    with ExitStack() as stack:
        if is_redis(broker):  # a database of its own: child workers share no keys
            broker = stack.enter_context(redis_database(broker))
        _kill_and_complete(tmp_path, sqlite_url, broker, monkeypatch)


def _kill_and_complete(
    tmp_path: Path, sqlite_url: str, broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = LLMServer().start()
    env = {
        **os.environ,
        "RECAP_DATABASE_URL": sqlite_url,
        "RECAP_BROKER_URL": broker,
        "RECAP_SUMMARY_MODEL": "openai/stand-in",
        "RECAP_SUMMARY_API_BASE": server.url,
        "RECAP_SUMMARY_API_KEY": "test-key",
        "RECAP_TASK_TIME_LIMIT": "30",  # the run's deadline counts a fresh worker's litellm import
        "RECAP_RECONCILE_SECONDS": "2",
        "RECAP_RETRY_BACKOFF_MAX": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    env.pop("RECAP_RESULT_BACKEND", None)
    for key in ("RECAP_DATABASE_URL", "RECAP_BROKER_URL", "RECAP_TASK_TIME_LIMIT"):
        monkeypatch.setenv(key, env[key])
    get_settings.cache_clear()
    settings = get_settings()
    engine = make_engine(sqlite_url)
    upgrade(engine)
    h = Harness(engine, server, settings, PoolWatch(engine))
    cid = h.new(turns=12)
    workers: list[WorkerProcess] = []
    first_log, second_log = tmp_path / "w1.log", tmp_path / "w2.log"
    try:
        server.script(Reply(hold=True))
        first = WorkerProcess(env, first_log, ("-P", "threads", "-c", "2"), program=CELERY)
        workers.append(first.launch())
        with configured_app(settings, None):
            task_id = app.send_task("recap.compress_session", args=[cid]).id
        assert server.wait_for(1, timeout=60), first_log.read_text()
        assert first.process is not None
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait()
        killed_at = time.monotonic()
        _expire_the_lease(engine, cid)
        schedule = str(tmp_path / "beat-schedule")
        args = ("-P", "threads", "-c", "4", "-B", "-s", schedule, "-l", "INFO")
        workers.append(WorkerProcess(env, second_log, args, program=CELERY).launch())
        wait_for(lambda: h.summaries(cid), KILL_DEADLINE, "the summary", second_log)
        assert time.monotonic() - killed_at < KILL_DEADLINE
        if is_redis(broker):
            _redeliver_unacked(broker)
        wait_for(lambda: _finished(second_log, task_id), 30, "the redelivered run", second_log)
        assert len(h.summaries(cid)) == 1
        assert [a for a, _ in h.log(cid)].count("summarized") == 1
    finally:
        for worker in workers:  # the test is over: no warm shutdown to wait for
            if worker.process is not None and worker.process.poll() is None:
                os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait()
        server.stop()
        engine.dispose()


# --- the lease, on both databases --------------------------------------------------------------


def test_lease_single_flight_and_expiry(engine: Engine, settings: Settings) -> None:
    """One holder at a time; a second run marks dirty; release reports it; an expired lease can
    be taken over, and the old holder then finds it lost."""
    service.import_conversations(engine, [{"id": "c", "messages": chat(1)}], settings)
    now = utcnow()
    mine = lease.acquire(engine, "c", owner="a", now=now, seconds=60)
    assert mine is not None
    assert lease.acquire(engine, "c", owner="b", now=now, seconds=60) is None
    assert lease.release(engine, mine) == "dirty"
    assert lease.release(engine, mine) == "released"
    again = lease.acquire(engine, "c", owner="b", now=now, seconds=60)
    assert again is not None
    later = now + timedelta(seconds=61)
    taken = lease.acquire(engine, "c", owner="c", now=later, seconds=60)
    assert taken is not None
    assert lease.release(engine, again) == "lost"
    assert lease.release(engine, taken) == "released"
    with engine.connect() as connection:
        row = connection.execute(text("SELECT lease_owner, dirty FROM conversations")).one()
    assert row[0] is None and not row[1]


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_compress_in_process_with_the_extractive_summarizer(
    sqlite_engine: Engine, settings: Settings
) -> None:
    """Without a summary model, `recap compress` summarizes offline and says so."""
    service.import_conversations(
        sqlite_engine, [{"id": "c", "messages": chat(12)}], settings, max_input_tokens=WINDOW
    )
    done = recap("compress", "c", "--json").json()
    assert done["action"] == "summarized"
    (row,) = recap("summaries", "c", "--json").json()["summaries"]
    assert row["model"] == "extractive" and 0 <= row["identifier_retention"] <= 1
    again = recap("compress", "c", "--json").json()
    assert again["action"] == "skipped"


def test_cli_failed_run_exits_non_zero(
    sqlite_engine: Engine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed run prints action failed as JSON and exits non-zero."""
    server = LLMServer().start()
    try:
        monkeypatch.setenv("RECAP_SUMMARY_MODEL", "openai/stand-in")
        monkeypatch.setenv("RECAP_SUMMARY_API_BASE", server.url)
        monkeypatch.setenv("RECAP_SUMMARY_API_KEY", "test-key")
        service.import_conversations(
            sqlite_engine, [{"id": "c", "messages": chat(12)}], settings, max_input_tokens=WINDOW
        )
        server.script(Reply(status=401))
        result = recap("compress", "c", "--json")
        assert result.code != 0
        import json

        assert json.loads(result.stdout)["action"] == "failed"
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("compress", "nope", "--json"), "unknown conversation"),
        (("compress", "c", "--leaf", "999", "--json"), "message 999"),
    ],
)
def test_cli_bad_input_is_one_line_and_changes_nothing(
    sqlite_engine: Engine, settings: Settings, args: tuple[str, ...], fragment: str
) -> None:
    """An unknown conversation or leaf is one clear line on stderr, and nothing is written."""
    service.import_conversations(
        sqlite_engine, [{"id": "c", "messages": chat(12)}], settings, max_input_tokens=WINDOW
    )
    assert_one_line_error(recap(*args), fragment)
    with sqlite_engine.connect() as connection:
        assert connection.execute(select(LOG.c.id)).all() == []
        assert connection.execute(select(SUMMARIES.c.id)).all() == []
        owner = connection.execute(text("SELECT lease_owner FROM conversations")).scalar()
    assert owner is None


def test_cli_enqueue_and_reconcile(
    sqlite_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--enqueue` returns a task id the worker runs; `recap reconcile` re-enqueues a
    conversation over its trigger that no run has seen."""
    with harness_for(sqlite_url, redis_url, monkeypatch) as h:
        cid = h.new(turns=12)
        sent = recap("compress", cid, "--enqueue", "--json").json()
        result = app.AsyncResult(sent["task_id"]).get(timeout=RESULT_TIMEOUT)
        assert result["action"] == "summarized"

        other = h.new(turns=12)
        assert recap("reconcile", "--json").json() == {"enqueued": 1}
        wait_for(lambda: h.summaries(other), RESULT_TIMEOUT, "reconcile's run to summarize")
        assert len(h.summaries(other)) == 1
        assert recap("reconcile", "--json").json() == {"enqueued": 0}
