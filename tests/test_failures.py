"""Failed compressions are failures: FAILURE in Celery and Flower, RETRY while retried, listed by
``recap failures`` and re-enqueued by ``recap retry``.

Workers are real (an in-process worker on Redis, or on RabbitMQ for a failure, a retry and
`recap retry`, with a Redis result backend; or a worker child process with Flower beside it), the
model is the local server over HTTP, the databases are real SQLite and PostgreSQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine, insert, select

from recap.core import service
from recap.core.settings import get_settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import CompactionLog, table_of, utcnow
from recap.core.storage.store import failed_runs
from tests.support.brokers import broker_url_for
from tests.support.celery_helpers import configured_app
from tests.support.cli_helpers import assert_one_line_error, recap
from tests.support.data import migrated
from tests.support.llm_server import Reply
from tests.support.processes import stop_group
from tests.test_compress_worker import RESULT_TIMEOUT, Harness, chat, harness_for
from tests.test_operations import (
    READY_TIMEOUT,
    _flower,
    _http,
    _wait,
    free_port,
    stack,
)
from recap.workers.app import app
from recap.workers.errors import CompressionFailed, CompressionRetry

LOG = table_of(CompactionLog)
API_KEY = "sk-test-echoed-by-the-provider-0123456789abcd"  # sk-shaped, as OpenAI's are
WINDOW = 3_000  # the worker tests' window: a dozen turns go over the trigger


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30m", 1_800),
        ("2h", 7_200),
        ("7d", 604_800),
        ("1w", 604_800),
        ("45s", 45),
        ("1.5h", 5_400),
        (" 2H ", 7_200),
    ],
)
def test_durations_parse(text: str, seconds: float) -> None:
    """A number and a unit (s, m, h, d, w) is that many seconds."""
    from recap.workers.cli import parse_duration

    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text",
    ["nonsense", "", "0h", "-2h", "2", "h", "2 hours", "1e3d", "nan", "inf", "99999999d", "2h30m"],
)
def test_bad_durations_are_refused(text: str) -> None:
    """Anything but a positive number and one unit, within ten years, is an input error."""
    from recap.core.errors import InputError
    from recap.workers.cli import parse_duration

    with pytest.raises(InputError, match="--since"):
        parse_duration(text)


# --- the store's list of failed runs -----------------------------------------------------------


def _conversation(engine: Engine, settings: Any, cid: str) -> str:
    service.import_conversations(
        engine, [{"id": cid, "messages": chat(2)}], settings, max_input_tokens=WINDOW
    )
    return cid


def _log(engine: Engine, cid: str, action: str, at: datetime, **values: Any) -> None:
    row = {
        "conversation_id": cid,
        "trigger": "enqueue",
        "action": action,
        "reason": action,
        "created_at": at,
        **values,
    }
    with session_scope(engine) as session:
        session.connection().execute(insert(LOG).values(**row))


def test_failed_runs_lists_the_unsettled_latest_failure_of_each(
    engine: Engine, settings: Any
) -> None:
    """Each conversation's latest failure in the window, unless a later run summarized or cleared
    it; attempts count the retries of that task; newest first."""
    now = utcnow()
    hour = timedelta(hours=1)
    for cid in ("retried", "fixed", "cleared", "old", "twice", "other-task"):
        _conversation(engine, settings, cid)
    _log(engine, "retried", "retry", now - 3 * hour, task_id="t1")
    _log(engine, "retried", "retry", now - 3 * hour, task_id="t1")
    _log(engine, "retried", "failed", now - 3 * hour, task_id="t1", reason="gave up")
    _log(engine, "fixed", "failed", now - 2 * hour)
    _log(engine, "fixed", "summarized", now - hour)
    _log(engine, "cleared", "failed", now - 2 * hour)
    _log(engine, "cleared", "cleared", now - hour)
    _log(engine, "old", "failed", now - 48 * hour)
    _log(engine, "twice", "failed", now - 2 * hour, reason="first")
    _log(engine, "twice", "skipped", now - hour)
    _log(engine, "twice", "failed", now - hour / 2, reason="second", task_id="t2")
    _log(engine, "other-task", "retry", now - hour, task_id="t9")
    _log(engine, "other-task", "failed", now - hour, task_id="t3")
    with session_scope(engine) as session:
        runs = failed_runs(session, since=now - 24 * hour)
        only = failed_runs(session, since=now - 24 * hour, conversation_ids=["retried"])
    assert [(r.conversation_id, r.reason, r.attempts, r.task_id) for r in runs] == [
        ("twice", "second", 1, "t2"),
        ("other-task", "failed", 1, "t3"),
        ("retried", "gave up", 3, "t1"),
    ]
    assert all(r.at.tzinfo is not None for r in runs)
    assert abs(runs[0].at - (now - hour / 2)) < timedelta(seconds=1)
    assert [r.conversation_id for r in only] == ["retried"]


# --- the task's state on a real worker ---------------------------------------------------------


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str:
    """The worker's broker: each of Redis and RabbitMQ (``tests/support/brokers.py``)."""
    return broker_url_for(request)


@pytest.fixture
def harness(sqlite_url: str, broker: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """A worker on the broker over SQLite (results in Redis), calling the local model."""
    with harness_for(sqlite_url, broker, monkeypatch, RECAP_SUMMARY_API_KEY=API_KEY) as h:
        yield h


def _send(cid: str, **kwargs: Any) -> Any:
    return app.send_task("recap.compress_session", args=[cid], kwargs=kwargs)


def _reasons(engine: Engine, cid: str) -> list[tuple[str, str, str | None]]:
    with session_scope(engine) as session:
        rows = session.connection().execute(
            select(LOG.c.action, LOG.c.reason, LOG.c.error)
            .where(LOG.c.conversation_id == cid)
            .order_by(LOG.c.id)
        )
        return [(str(a), str(r), e) for a, r, e in rows]


def test_a_401_ends_failure_with_the_masked_reason(harness: Harness) -> None:
    """A provider that echoes the key in its 401: the run is recorded failed, then the task ends
    FAILURE with one CompressionFailed whose message is the stored (masked) reason; the key is in
    neither, nor in the stored traceback."""
    cid = harness.new(turns=12)
    harness.server.script(Reply(status=401, error=f"Incorrect API key provided: {API_KEY}."))
    result = _send(cid)
    error = result.get(timeout=RESULT_TIMEOUT, propagate=False)
    assert harness.server.requests[0].headers.get("authorization") == f"Bearer {API_KEY}"
    assert result.state == "FAILURE"
    assert isinstance(error, CompressionFailed)
    ((action, reason, stored_error),) = _reasons(harness.engine, cid)
    assert action == "failed" and str(error) == reason == stored_error
    assert "AuthenticationError" in reason and "sk-...abcd" in reason
    assert API_KEY not in reason
    traceback = result.traceback or ""
    assert API_KEY not in traceback and "CompressionFailed" in traceback
    assert "During handling" not in traceback and "direct cause" not in traceback
    assert "compress.py" not in traceback  # the task's frame only, no run internals
    assert harness.summaries(cid) == []


def test_429_then_success_ends_success_after_a_retry(harness: Harness) -> None:
    """A rate limit puts the task in RETRY (Celery's own retry); the next attempt succeeds."""
    cid = harness.new(turns=12)
    harness.server.script(Reply(status=429, error=f"slow down, key {API_KEY}"), Reply(hold=True))
    result = _send(cid)
    assert harness.server.wait_for(2, timeout=RESULT_TIMEOUT), "the retry reached the model"
    assert result.state == "RETRY"  # the second attempt is held, so the state is still RETRY
    assert isinstance(result.result, CompressionRetry)
    assert API_KEY not in str(result.result) and "RateLimitError" in str(result.result)
    harness.server.release()
    done = result.get(timeout=RESULT_TIMEOUT)
    assert result.state == "SUCCESS" and done["action"] == "summarized"
    assert [a for a, _, _ in _reasons(harness.engine, cid)] == ["retry", "summarized"]
    assert all(API_KEY not in str(e) for _, _, e in _reasons(harness.engine, cid))


def test_skipped_and_busy_runs_stay_success(harness: Harness) -> None:
    """Under the trigger the task succeeds with the contract's JSON, exactly as before."""
    cid = harness.new(turns=2)
    result = _send(cid)
    done = result.get(timeout=RESULT_TIMEOUT)
    assert result.state == "SUCCESS"
    assert done == {
        "action": "skipped",
        "reason": done["reason"],
        "summary_id": None,
        "cutoff_message_id": None,
        "tokens_before": done["tokens_before"],
        "tokens_after": done["tokens_before"],
    }
    assert done["reason"].startswith("under the trigger")


def test_unknown_conversation_is_skipped_naming_it(harness: Harness) -> None:
    """A task for a conversation that is not stored (deleted since it was enqueued, or never
    stored) ends as skipped, naming it, and writes nothing."""
    result = _send("no-such-conversation")
    done = result.get(timeout=RESULT_TIMEOUT)
    assert result.state == "SUCCESS" and done["action"] == "skipped"
    assert "no-such-conversation" in done["reason"]


def test_reconcile_still_picks_up_a_failed_conversation(harness: Harness) -> None:
    """After a FAILURE the conversation is still over its trigger; once it has a new turn,
    reconcile enqueues it and the next run summarizes it."""
    cid = harness.new(turns=12)
    harness.server.script(Reply(status=401))
    assert _send(cid).get(timeout=RESULT_TIMEOUT, propagate=False) is not None
    harness.add(cid, chat(1, tag="later")[1:])
    assert recap("reconcile", "--json").json() == {"enqueued": 1}
    _wait(lambda: harness.summaries(cid), RESULT_TIMEOUT, "reconcile's run to summarize")


# --- recap failures and recap retry ------------------------------------------------------------


@pytest.fixture
def any_db_harness(db_url: str, broker: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The worker harness over SQLite and over PostgreSQL."""
    with harness_for(db_url, broker, monkeypatch, RECAP_SUMMARY_API_KEY=API_KEY) as h:
        yield h


@pytest.fixture
def broker_only(
    db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Iterator[Engine]:
    """A database of each kind and the app on Redis with a key prefix of its own, no worker:
    whatever is enqueued stays in the queue for the test to count."""
    monkeypatch.setenv("RECAP_BROKER_URL", redis_url)
    engine = migrated(db_url, monkeypatch)
    with configured_app(get_settings(), f"recap-test-{uuid.uuid4().hex[:10]}:"):
        yield engine
        client = redis.Redis.from_url(redis_url)
        client.delete(_queue_key())


def _queue_key() -> str:
    return f"{app.conf.broker_transport_options['global_keyprefix']}compress"


def _queued() -> int:
    """Messages waiting in this test's compress queue."""
    return int(redis.Redis.from_url(app.conf.broker_url).llen(_queue_key()))


@pytest.mark.parametrize(
    ("db_url", "broker"),
    [("sqlite", "redis"), ("postgres", "redis"), ("postgres", "rabbitmq")],
    indirect=True,
)
def test_failures_then_retry_after_the_model_is_fixed(any_db_harness: Harness) -> None:
    """`recap failures` lists the failed conversations (masked reason, attempts); `recap retry`
    by id and `--all-failed` enqueue them on the broker (Redis, or RabbitMQ's quorum queue);
    the runs summarize; the list empties."""
    h = any_db_harness
    first, second, fine = h.new(turns=12), h.new(turns=12), h.new(turns=2)
    h.server.script(*[Reply(status=401, error=f"Incorrect API key provided: {API_KEY}")] * 2)
    for cid in (first, second):
        assert _send(cid).get(timeout=RESULT_TIMEOUT, propagate=False) is not None
    assert _send(fine).get(timeout=RESULT_TIMEOUT)["action"] == "skipped"

    shown = recap("failures", "--json")
    listed = shown.json()["failures"]
    assert sorted(r["conversation_id"] for r in listed) == sorted([first, second])
    assert all(r["attempts"] == 1 and "AuthenticationError" in r["reason"] for r in listed)
    human = recap("failures")
    assert human.code == 0 and first[-6:] in human.stdout
    assert API_KEY not in shown.stdout + human.stdout + shown.stderr + human.stderr

    one = recap("retry", first, "--json").json()
    assert one["enqueued"] == 1 and len(one["task_ids"]) == 1
    assert app.AsyncResult(one["task_ids"][0]).get(timeout=RESULT_TIMEOUT)["action"] == "summarized"
    rest = recap("retry", "--all-failed", "--since", "1h", "--json").json()
    assert rest["enqueued"] == 1 and rest["conversations"] == [second]
    assert (
        app.AsyncResult(rest["task_ids"][0]).get(timeout=RESULT_TIMEOUT)["action"] == "summarized"
    )
    assert len(h.summaries(first)) == len(h.summaries(second)) == 1
    assert recap("failures", "--json").json() == {"failures": []}
    assert recap("retry", "--all-failed", "--json").json()["enqueued"] == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("failures", "--since", "nonsense"), "--since"),
        (("retry", "--all-failed", "--since", "nonsense"), "--since"),
        (("retry", "no-such-conversation"), "no-such-conversation"),
        (("retry",), "--all-failed"),
        (("retry", "CID", "--all-failed"), "--all-failed"),
        (("retry", "CID", "--since", "2h"), "--since"),
    ],
)
def test_bad_failures_and_retry_input_is_one_line_and_enqueues_nothing(
    broker_only: Engine, args: tuple[str, ...], fragment: str
) -> None:
    """Bad input is one clear line on stderr, a non-zero exit, and no task sent (a good retry,
    the control, sends one)."""
    cid = _conversation(broker_only, get_settings(), "c-1")
    assert_one_line_error(recap(*[cid if a == "CID" else a for a in args]), fragment)
    assert _queued() == 0
    assert recap("retry", cid, "--json").json()["enqueued"] == 1
    assert _queued() == 1


# --- Flower ------------------------------------------------------------------------------------


EVENT_PROBE_SECONDS = 5.0  # how long one probe task may take to show up in Flower


def _flower_sees_events(client: Celery, base: str) -> bool:
    """Whether Flower has seen a probe task from its first event on: its event receiver starts
    a little after its API answers, and a task it half saw would have no name. The probe names
    no conversation that exists, so it fails at once without touching any."""
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    task_id = client.send_task("recap.compress_session", args=[probe], queue="compress").id

    def named() -> bool:
        code, task = _http("GET", f"{base}/api/task/info/{task_id}")
        return code == 200 and bool(task) and task.get("name") == "recap.compress_session"

    try:
        return bool(_wait(named, EVENT_PROBE_SECONDS, "the probe"))
    except AssertionError:
        return False


def test_flower_lists_the_failure_and_reruns_it(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Flower lists a 401 run under state FAILURE with the conversation id as the first argument,
    the kwargs as JSON and the masked reason as the exception; re-run through its async-apply
    API after the model is fixed, it succeeds with exactly one summary."""
    pytest.importorskip("flower", reason="flower is in the dev extra")
    with stack(postgres_url, redis_url, tmp_path, RECAP_MAX_ATTEMPTS="1") as s:
        cid = s.new_conversation()
        port = free_port()
        flower = _flower(s.env, port, tmp_path / "flower.log")
        base = f"http://127.0.0.1:{port}"
        try:
            _wait(lambda: _http("GET", f"{base}/api/workers")[0] == 200, READY_TIMEOUT, "Flower")
            client = Celery(broker=s.redis_url)  # a host's send_task by name, Python's reprs
            _wait(lambda: _flower_sees_events(client, base), READY_TIMEOUT, "Flower's events")
            s.server.script(Reply(status=401, error=f"Incorrect API key provided: {API_KEY}"))
            task_id = client.send_task("recap.compress_session", args=[cid], queue="compress").id
            client.close()

            def failed() -> Any:
                code, tasks = _http("GET", f"{base}/api/tasks?state=FAILURE")
                return tasks.get(task_id) if code == 200 and tasks else None

            task = _wait(failed, 90, "Flower to list the failure")
            assert task["name"] == "recap.compress_session"
            assert task["args"] == f'["{cid}"]' and task["kwargs"] == "{}"
            assert task["exception"].startswith("CompressionFailed(")
            assert "AuthenticationError" in task["exception"]
            assert API_KEY not in str(task)
            status, rerun = _http(
                "POST",
                f"{base}/api/task/async-apply/recap.compress_session",
                {"args": [cid], "kwargs": {}},
            )
            assert status == 200, (status, (tmp_path / "flower.log").read_text()[-2000:])

            def finished() -> Any:
                code, body = _http("GET", f"{base}/api/task/result/{rerun['task-id']}")
                return body if code == 200 and body and body.get("state") == "SUCCESS" else None

            result = _wait(finished, 90, "the re-run to finish")
        finally:
            stop_group(flower)
        assert result["result"]["action"] == "summarized", result
        assert len(service.list_summaries(s.engine, cid)) == 1
