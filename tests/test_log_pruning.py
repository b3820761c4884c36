"""The compaction log's retention on SQLite and PostgreSQL: skipped runs are kept a few days,
every run for the longer history, the cooldown's reading of failures is unchanged, and the beat
task prunes in batches on a real worker."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select

from recap.core import service
from recap.core.settings import Settings, get_settings
from recap.core.storage.compaction_log import LOG, cuts, doomed, prune_log, record_run
from recap.core.storage.snapshot import recent_failures
from tests.support.celery_helpers import follow_runs, solo_worker

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RETENTION, HISTORY = 3, 90  # the defaults, in days


@pytest.mark.parametrize(
    ("action", "age_days", "gone"),
    [
        ("skipped", 1, False),
        ("skipped", 3.5, True),
        ("skipped", 100, True),
        ("failed", 3.5, False),
        ("failed", 91, True),
        ("summarized", 60, False),
        ("summarized", 90.5, True),
        ("cleared", 10, False),
        ("retry", 10, False),
    ],
)
def test_doomed(action: str, age_days: float, gone: bool) -> None:
    """Which rows are past their retention, by action and age."""
    at = cuts(NOW, retention_days=RETENTION, history_days=HISTORY)
    assert doomed(action, NOW - timedelta(days=age_days), at) is gone


@pytest.mark.parametrize(("first_days", "last_days", "gone"), [(10, 1, False), (10, 4, True)])
def test_a_skip_streak_lasts_from_its_latest_run(
    first_days: float, last_days: float, gone: bool
) -> None:
    """A row that stands for a streak of skips is kept while its latest run is recent."""
    at = cuts(NOW, retention_days=RETENTION, history_days=HISTORY)
    first, last = NOW - timedelta(days=first_days), NOW - timedelta(days=last_days)
    assert doomed("skipped", first, at, last) is gone


def test_history_never_shorter_than_retention() -> None:
    """A history shorter than the skip retention is taken as the retention."""
    at = cuts(NOW, retention_days=5, history_days=1)
    assert at.all_before == at.skipped_before == NOW - timedelta(days=5)


def test_settings_refuse_a_shorter_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """RECAP_LOG_HISTORY_DAYS below RECAP_LOG_RETENTION_DAYS is one clear error."""
    monkeypatch.setenv("RECAP_LOG_HISTORY_DAYS", "1")
    get_settings.cache_clear()
    with pytest.raises(ValueError, match="RECAP_LOG_HISTORY_DAYS"):
        get_settings()
    get_settings.cache_clear()


def add_rows(engine: Engine, rows: list[tuple[str, str, float]]) -> None:
    """Log rows (conversation, action, age in days), inserted oldest first as runs write them:
    ids follow time."""
    values = [
        {
            "conversation_id": cid,
            "trigger": "enqueue",
            "action": action,
            "reason": f"{action} {age}",
            "created_at": NOW - timedelta(days=age),
        }
        for cid, action, age in sorted(rows, key=lambda row: -row[2])
    ]
    with engine.begin() as connection:
        connection.execute(insert(LOG), values)


def remaining(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        rows = connection.execute(select(LOG.c.action, LOG.c.reason).order_by(LOG.c.id))
        return [(str(r[0]), str(r[1])) for r in rows]


def history(count: int, newest_age: float = 0.5) -> list[tuple[str, float]]:
    """A conversation's runs over 120 days: mostly skips, with summaries, clearings, failures."""
    pattern = ["skipped", "skipped", "failed", "skipped", "summarized", "skipped", "cleared"]
    step = (120 - newest_age) / count
    return [(pattern[i % len(pattern)], 120 - i * step) for i in range(count)]


@pytest.fixture
def logged(engine: Engine, settings: Settings) -> tuple[Engine, list[str]]:
    cids = [service.new_conversation(engine, settings, f"c{i}") for i in range(2)]
    rows = [(cid, action, age) for cid in cids for action, age in history(140)]
    rows += [(cids[0], "failed", 0.2), (cids[0], "failed", 0.1)]  # a streak the cooldown reads
    add_rows(engine, rows)
    return engine, cids


@pytest.mark.parametrize("batch", [7, 1_000])
def test_prune_keeps_what_operators_need(logged: tuple[Engine, list[str]], batch: int) -> None:
    """Skips past the retention and every row past the history go; the rest stay in order, and
    the same answer comes in small batches as in one."""
    engine, cids = logged
    before = remaining(engine)
    with engine.connect() as connection:
        streak = [recent_failures(connection, cid, 3) for cid in cids]
    result = prune_log(
        engine,
        now=NOW,
        retention_days=RETENTION,
        history_days=HISTORY,
        batch=batch,
        max_batches=None,
    )
    at = cuts(NOW, retention_days=RETENTION, history_days=HISTORY)
    kept = [
        row
        for row in before
        if not doomed(row[0], NOW - timedelta(days=float(row[1].split()[1])), at)
    ]
    assert remaining(engine) == kept
    assert result.deleted == len(before) - len(kept) > 0
    assert result.more is False
    assert any(action == "skipped" for action, _ in kept)  # a bounded trace of recent skips
    assert {action for action, _ in kept} >= {"failed", "summarized", "cleared"}
    with engine.connect() as connection:
        assert [recent_failures(connection, cid, 3) for cid in cids] == streak
    again = prune_log(engine, now=NOW, retention_days=RETENTION, history_days=HISTORY)
    assert again.deleted == 0


def test_prune_stops_at_the_batch_limit(logged: tuple[Engine, list[str]]) -> None:
    """A run of a bounded number of batches says where it stopped; the next run goes on."""
    engine, _ = logged
    first = prune_log(
        engine, now=NOW, retention_days=RETENTION, history_days=HISTORY, batch=5, max_batches=2
    )
    assert first.examined == 10 and first.more is True
    rest = prune_log(
        engine,
        now=NOW,
        retention_days=RETENTION,
        history_days=HISTORY,
        after_id=first.last_id,
        max_batches=None,
    )
    full = [row for row in remaining(engine) if row[0] == "skipped"]
    assert rest.more is False
    assert all(float(reason.split()[1]) < RETENTION for _, reason in full)


# --- the beat task on a real worker ------------------------------------------------------------


@pytest.fixture
def worker(
    redis_url: str, sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A real worker thread on the Redis broker (``solo_worker``)."""
    with solo_worker(redis_url, monkeypatch):
        yield


def test_prune_task_on_a_worker(worker: None, sqlite_engine: Engine) -> None:
    """The beat task prunes in batches, re-enqueuing itself until nothing is left; it is on the
    beat schedule and routed to the maintenance queue."""
    from recap.workers.app import TASK_ROUTES, beat_schedule
    from recap.workers.maintenance import PRUNE_LOG_TASK, prune_compaction_log

    settings = get_settings()
    cid = service.new_conversation(sqlite_engine, settings, "w")
    now = datetime.now(UTC)
    rows = history(60, newest_age=0.01)
    shift = (NOW - now).total_seconds() / 86_400  # rows aged from the real clock
    add_rows(sqlite_engine, [(cid, action, age + shift) for action, age in rows])
    before = len(remaining(sqlite_engine))
    first = prune_compaction_log.apply_async(kwargs={"batch": 2}).get(timeout=30)
    runs = follow_runs(first)
    assert len(runs) > 1 and runs[-1]["more"] is False
    deleted = sum(run["deleted"] for run in runs)
    assert deleted > 0 and len(remaining(sqlite_engine)) == before - deleted
    entry = beat_schedule(settings)["prune-compaction-log"]
    assert entry["task"] == PRUNE_LOG_TASK and entry["schedule"] == settings.log_prune_seconds
    assert TASK_ROUTES[PRUNE_LOG_TASK]["queue"] == "maintenance"


# --- the trace of skips ---------------------------------------------------------------------------


def _run_row(cid: str, action: str, minute: int) -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "trigger": "enqueue",
        "action": action,
        "reason": f"{action} at {minute}",
        "tokens_before": minute,
        "tokens_after": minute,
        "created_at": NOW + timedelta(minutes=minute),
    }


def test_consecutive_skips_share_a_row(engine: Engine, settings: Settings) -> None:
    """A skip after a skip of the same conversation is counted on that row (the latest run's
    reason and time); anything else, or another conversation's skip, is a row of its own."""
    one, two = (service.new_conversation(engine, settings, name) for name in ("one", "two"))
    runs = [(one, "skipped"), (one, "skipped"), (two, "skipped"), (one, "skipped")]
    runs += [(one, "summarized"), (one, "skipped"), (two, "skipped"), (one, "failed")]
    runs += [(one, "skipped"), (one, "skipped")]
    for minute, (cid, action) in enumerate(runs):
        with engine.begin() as connection:
            record_run(connection, _run_row(cid, action, minute))
    c = LOG.c
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                c.conversation_id, c.action, c.repeats, c.reason, c.created_at, c.last_seen_at
            ).order_by(c.id)
        ).all()
    found = [(cid, action, repeats, reason) for cid, action, repeats, reason, _, _ in rows]
    assert found == [
        (one, "skipped", 3, "skipped at 3"),
        (two, "skipped", 2, "skipped at 6"),
        (one, "summarized", 1, "summarized at 4"),
        (one, "skipped", 1, "skipped at 5"),
        (one, "failed", 1, "failed at 7"),
        (one, "skipped", 2, "skipped at 9"),
    ]
    first, last = rows[0][4], rows[0][5]
    assert first.replace(tzinfo=UTC) == NOW and last.replace(tzinfo=UTC) == NOW + timedelta(
        minutes=3
    )
    assert rows[2][5] is None  # a row of one run has no later sighting


def test_runs_that_skip_leave_one_row(sqlite_engine: Engine, settings: Settings) -> None:
    """Twenty production runs that skip, one after another, leave one row counting twenty."""
    from recap.workers.compress import compress_now

    cid = service.new_conversation(sqlite_engine, settings, "quiet")
    service.add_message(sqlite_engine, cid, {"role": "user", "content": "hello"})
    for _ in range(20):
        assert compress_now(sqlite_engine, settings, cid)["action"] == "skipped"
    with sqlite_engine.connect() as connection:
        rows = connection.execute(select(LOG.c.action, LOG.c.repeats)).all()
    assert [tuple(row) for row in rows] == [("skipped", 20)]


def test_a_run_overtaken_by_another_keeps_its_row(
    sqlite_engine: Engine, settings: Settings
) -> None:
    """A skip that found its summary written by another run names it, and is never merged."""
    cid = service.new_conversation(sqlite_engine, settings, "overtaken")
    overtaken = {**_run_row(cid, "skipped", 1), "summary_id": 7, "reason": "by another run"}
    for values in (_run_row(cid, "skipped", 0), overtaken, _run_row(cid, "skipped", 2)):
        with sqlite_engine.begin() as connection:
            record_run(connection, values)
    with sqlite_engine.connect() as connection:
        rows = connection.execute(select(LOG.c.summary_id, LOG.c.repeats).order_by(LOG.c.id))
        assert [tuple(row) for row in rows] == [(None, 1), (7, 1), (None, 1)]
