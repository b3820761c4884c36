"""The idle sweep on SQLite and PostgreSQL, `recap sweep`, and both maintenance tasks on a real
Celery worker with a Redis broker."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text, update

from recap.core import service
from recap.core.counting import tokens
from recap.core.decision.toolresults import IDLE, plan_clearings
from recap.core.settings import get_settings, load_settings
from recap.core.storage import compressed, reads
from recap.core.storage.db import session_scope
from recap.core.storage.erase import delete_conversation
from recap.core.storage.models import CONVERSATIONS, utcnow
from recap.core.storage.sweep import apply_clearings, sweep_idle
from tests.support.celery_helpers import follow_runs, solo_worker
from tests.support.cli_helpers import assert_one_line_error, recap
from tests.support.data import load_data, migrated

BIG = "result line with some numbers 12345 and words\n" * 120


def agent_record(cid: str, tools: list[str]) -> dict[str, Any]:
    """One user turn followed by one call and one large result per tool name."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug."}]
    for index, tool in enumerate(tools):
        call_id = f"{cid}_call_{index}"
        function = {"name": tool, "arguments": "{}"}
        messages.append(
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call_id, "type": "function", "function": function}]}
        )  # fmt: skip
        messages.append({"role": "tool", "content": BIG, "tool_call_id": call_id, "name": tool})
    messages.append({"role": "assistant", "content": "Done."})
    return {"id": cid, "messages": messages}


def make_idle(engine: Engine, *ids: str, minutes: float = 120) -> None:
    with engine.begin() as connection:
        connection.execute(
            update(CONVERSATIONS)
            .where(CONVERSATIONS.c.id.in_(ids))
            .values(last_activity_at=utcnow() - timedelta(minutes=minutes))
        )


def cleared_ids(engine: Engine, cid: str) -> list[int]:
    with session_scope(engine) as session:
        return sorted(compressed.load_clearings(session, cid))


def tool_ids(engine: Engine, cid: str) -> list[int]:
    with session_scope(engine) as session:
        return [m.id for m in reads.load_whole_branch(session, cid).branch if m.role == "tool"]


def table_rows(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    with engine.connect() as connection:
        return [tuple(r) for r in connection.execute(text(f"SELECT * FROM {table} ORDER BY id"))]


@pytest.fixture
def agents(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """Three agent runs: two idle for two hours, one active now; the idle sweep keeps 3."""
    monkeypatch.setenv("RECAP_IDLE_KEEP_TOOL_RESULTS", "3")
    get_settings.cache_clear()
    records = [
        agent_record("idle-a", ["bash", "todo_write", "bash", "bash", "bash", "bash", "bash"]),
        agent_record("idle-b", ["grep", "grep", "grep", "grep"]),
        agent_record("active", ["bash"] * 6),
    ]
    service.import_conversations(engine, records, get_settings())
    make_idle(engine, "idle-a", "idle-b")
    return engine


def test_sweep_clears_old_results_of_idle_conversations_only(agents: Engine) -> None:
    """Idle conversations lose all but their last 3 results (protected tools kept); the active
    one is untouched; messages are not modified; a second sweep finds nothing."""
    messages_before = table_rows(agents, "messages")
    activity_before = table_rows(agents, "conversations")
    result = sweep_idle(agents, get_settings(), now=utcnow())
    a, b = tool_ids(agents, "idle-a"), tool_ids(agents, "idle-b")
    assert cleared_ids(agents, "idle-a") == [a[0], a[2], a[3]]  # a[1] is todo_write
    assert cleared_ids(agents, "idle-b") == [b[0]]
    assert cleared_ids(agents, "active") == []
    assert result.as_dict()["cleared"] == 4 and result.conversations == 2
    assert table_rows(agents, "messages") == messages_before
    assert table_rows(agents, "conversations") == activity_before
    again = sweep_idle(agents, get_settings(), now=utcnow())
    assert (again.cleared, again.tokens_reclaimed) == (0, 0)


def test_idle_sweep_keeps_one_result_by_default(
    agents: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default RECAP_IDLE_KEEP_TOOL_RESULTS (1) only the newest result and protected
    tools stay in full once the cache is cold."""
    monkeypatch.delenv("RECAP_IDLE_KEEP_TOOL_RESULTS")
    get_settings.cache_clear()
    assert get_settings().idle_keep_tool_results == 1
    sweep_idle(agents, get_settings(), now=utcnow())
    a, b = tool_ids(agents, "idle-a"), tool_ids(agents, "idle-b")
    assert cleared_ids(agents, "idle-a") == [a[0], *a[2:-1]]  # a[1] is todo_write
    assert cleared_ids(agents, "idle-b") == b[:-1]
    assert cleared_ids(agents, "active") == []


def test_sweep_matches_the_pure_plan(agents: Engine) -> None:
    """The set-based sweep records exactly what plan_clearings would: same ids, same tokens."""
    settings = get_settings()
    with session_scope(agents) as session:
        state = reads.load_whole_branch(session, "idle-a")
    plan = plan_clearings(
        state.branch,
        {},
        keep_last=settings.idle_keep_tool_results,
        protected=settings.protected_tools,
        min_tokens=1,
        reason=IDLE,
    )
    result = sweep_idle(agents, settings, now=utcnow())
    with session_scope(agents) as session:
        stored = compressed.load_clearings(session, "idle-a")
    assert {mid: c.tokens_reclaimed for mid, c in stored.items()} == {
        item.message_id: item.tokens_reclaimed for item in plan
    }
    assert result.tokens_reclaimed == plan.tokens_reclaimed + sum(
        c.tokens_reclaimed for c in store_clearings(agents, "idle-b").values()
    )


def store_clearings(engine: Engine, cid: str) -> dict[int, Any]:
    with session_scope(engine) as session:
        return compressed.load_clearings(session, cid)


def test_cleared_results_render_as_placeholders(agents: Engine) -> None:
    """After the sweep every result is still in the request: cleared ones as placeholders naming
    the tool and call, the last three in full; the request is smaller."""
    settings = get_settings()
    before = service.assemble(agents, "idle-a", settings, max_input_tokens=100_000)
    sweep_idle(agents, settings, now=utcnow())
    after = service.assemble(agents, "idle-a", settings, max_input_tokens=100_000)
    results = [m for m in after.messages if m["role"] == "tool"]
    assert len(results) == 7
    placeholders = [m for m in results if m["content"].startswith("[Cleared")]
    assert [m["tool_call_id"] for m in placeholders] == [
        "idle-a_call_0", "idle-a_call_2", "idle-a_call_3",
    ]  # fmt: skip
    assert all(m["tool_call_id"] in m["content"] and "bash" in m["content"] for m in placeholders)
    assert [m["content"] for m in results[-3:]] == [BIG] * 3
    assert after.tokens.total < before.tokens.total
    sent = tokens.count_messages(after.messages, tokens.encoding_name_for("gpt-4o-mini"))
    assert sent <= after.tokens.total < sent + 100 * len(placeholders)  # never understated
    recount = service.assemble(agents, "idle-a", settings, max_input_tokens=100_000)
    assert recount.messages == after.messages  # deterministic: same state, same bytes


def test_small_batches_give_the_same_result(agents: Engine) -> None:
    """Windows of one result clear the same results as one big window."""
    settings = load_settings(sweep_batch_size=1)
    result = sweep_idle(agents, settings, now=utcnow())
    assert result.cleared == 4 and result.batches == 18 and not result.more  # 17 results
    assert len(cleared_ids(agents, "idle-a")) == 3


def test_active_conversation_swept_only_when_asked(agents: Engine) -> None:
    """A conversation active now is left alone by default, and cleared with --idle-minutes 0."""
    assert recap("sweep", "--json").json()["cleared"] == 4
    assert cleared_ids(agents, "active") == []
    payload = recap("sweep", "--idle-minutes", "0", "--json").json()
    assert {"cleared", "tokens_reclaimed", "conversations"} <= set(payload)
    assert payload["cleared"] == 3 and payload["conversations"] == 1
    assert len(cleared_ids(agents, "active")) == 3


def test_sweep_skips_what_a_summary_covers(agents: Engine) -> None:
    """Results before the latest summary's cutoff are not sent anyway and are not cleared."""
    b = tool_ids(agents, "idle-b")
    with agents.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO summaries (conversation_id, cutoff_message_id, text, tokens, "
                "encoding, model, input_tokens, output_tokens, identifier_retention, created_at) "
                "VALUES ('idle-b', :cutoff, 's', 1, 'o200k_base', 'm', 0, 0, 1.0, :now)"
            ),
            {"cutoff": b[0], "now": utcnow()},
        )
    sweep_idle(agents, get_settings(), now=utcnow())
    assert cleared_ids(agents, "idle-b") == []


def test_apply_clearings_is_idempotent(agents: Engine) -> None:
    """Applying the same plan twice records each clearing once."""
    with session_scope(agents) as session:
        state = reads.load_whole_branch(session, "active")
    plan = plan_clearings(
        state.branch, {}, keep_last=3, protected=(), min_tokens=1, reason="pressure"
    )
    with session_scope(agents) as session:
        first = apply_clearings(session, "active", plan)
    with session_scope(agents) as session:
        second = apply_clearings(session, "active", plan)
    assert first.cleared == 3 and first.tokens_reclaimed == plan.tokens_reclaimed
    assert tuple(second) == (0, 0, 0, 0)


def test_sweep_bad_input(agents: Engine) -> None:
    """A negative idle time is one clear error and clears nothing."""
    assert_one_line_error(recap("sweep", "--idle-minutes", "-5"), "idle-minutes")
    assert table_rows(agents, "clearings") == []


def test_real_conversations_sweep(sqlite_engine: Engine) -> None:
    """Over the shared tau-bench runs the sweep clears, and every cleared result saves tokens."""
    records = load_data("tau_bench_airline.jsonl")[:40]
    service.import_conversations(sqlite_engine, records, get_settings())
    make_idle(sqlite_engine, *[r["id"] for r in records])
    result = sweep_idle(sqlite_engine, get_settings(), now=utcnow())
    assert result.cleared > 40 and result.tokens_reclaimed > 0
    assert all(row[4] > 0 for row in table_rows(sqlite_engine, "clearings"))


# --- the Celery tasks on a real worker ---------------------------------------------------------


@pytest.fixture
def worker(
    redis_url: str, sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A real worker thread on the Redis broker (``solo_worker``)."""
    with solo_worker(redis_url, monkeypatch, RECAP_SWEEP_BATCH_SIZE="2"):
        yield


def test_sweep_task_on_a_worker_reenqueues_until_done(worker: None, sqlite_engine: Engine) -> None:
    """The beat task clears one batch per run and re-enqueues itself until nothing is left."""
    from recap.workers.maintenance import sweep_idle_tool_results

    records = [agent_record(f"w{i}", ["bash"] * 5) for i in range(3)]
    service.import_conversations(sqlite_engine, records, get_settings())
    make_idle(sqlite_engine, *[r["id"] for r in records])
    first = sweep_idle_tool_results.apply_async().get(timeout=30)
    runs = follow_runs(first)
    assert first["cleared"] == 2 and first["more"] is True
    expected = 3 * (5 - get_settings().idle_keep_tool_results)  # all but the kept ones, x3
    assert sum(run["cleared"] for run in runs) == expected
    assert runs[-1]["more"] is False
    assert len(table_rows(sqlite_engine, "clearings")) == expected


def test_cleanup_task_on_a_worker(worker: None, tmp_path: Path) -> None:
    """The beat cleanup deletes expired saved outputs and reports what it deleted."""
    from recap.core.storage.outputs import save_output
    from recap.workers.maintenance import cleanup_truncated_outputs

    old = save_output(Path(get_settings().output_dir), "old " * 300)
    moment = time.time() - 30 * 86_400
    os.utime(old, (moment, moment))
    result = cleanup_truncated_outputs.apply_async().get(timeout=30)
    assert result == {"deleted": 1, "bytes": 1_200}
    assert not old.exists()


@pytest.mark.postgres
def test_sweep_files_nothing_under_a_conversation_recreated_during_its_insert(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PostgreSQL: the sweep's insert reads from its snapshot; a conversation erased and created
    again while the insert runs must not be left with clearings that name the erased one's
    messages. The insert is held at its first row, the clearing of an earlier idle conversation
    whose row another transaction holds `FOR UPDATE` (the foreign-key check waits for it), the
    victim is deleted and imported again meanwhile, then the holder rolls back."""
    import threading

    engine = migrated(postgres_url, monkeypatch)
    monkeypatch.setenv("RECAP_IDLE_KEEP_TOOL_RESULTS", "1")
    get_settings.cache_clear()
    records = [agent_record("first", ["bash", "bash"]), agent_record("victim", ["bash", "bash"])]
    service.import_conversations(engine, records, get_settings())
    make_idle(engine, "first", "victim")
    holder = engine.connect()
    holder.begin()
    holder.execute(text("SELECT id FROM conversations WHERE id = 'first' FOR UPDATE"))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = sweep_idle(engine, get_settings(), now=utcnow())
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    sweeper = threading.Thread(target=run)
    sweeper.start()
    deadline = time.monotonic() + 30
    with engine.connect() as probe:
        while time.monotonic() < deadline:  # until the sweep's insert waits on the holder
            waiting = probe.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query ILIKE '%INSERT INTO clearings%'"
                )
            ).scalar_one()
            probe.rollback()  # the activity view is read once per transaction
            if waiting:
                break
            time.sleep(0.05)
        else:
            holder.rollback()
            sweeper.join(30)
            pytest.fail(f"the sweep's insert never waited on the holder: {outcome}")
    delete_conversation(engine, "victim", tmp_path)
    service.import_conversations(engine, [agent_record("victim", ["grep"])], get_settings())
    holder.rollback()
    holder.close()
    sweeper.join(30)
    assert "result" in outcome
    reborn = set(tool_ids(engine, "victim"))
    with engine.connect() as connection:
        filed = connection.execute(
            text("SELECT message_id FROM clearings WHERE conversation_id = 'victim'")
        ).scalars()
        assert set(filed) <= reborn, "a clearing names a message of the erased conversation"
        kept = connection.execute(
            text("SELECT count(*) FROM clearings WHERE reason = 'idle' AND stage = 'cleared'")
        ).scalar_one()
    # what the sweep reports is what stayed: the rows taken back are not counted
    assert outcome["result"].cleared == kept
    assert outcome["result"].conversations == 1  # "first" only


@pytest.mark.postgres
def test_a_sweep_batch_runs_without_jit_and_leaves_the_setting_behind(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL compiled the sweep's statements with JIT on every batch once its large
    tables put them above ``jit_above_cost`` (about 70 ms a batch, most of its time): a batch
    turns JIT off for its own transaction only, so a pooled connection keeps its setting."""
    from sqlmodel import Session

    from recap.core.storage.db import without_jit
    from recap.core.storage.sweep import sweep_batch

    engine = migrated(postgres_url, monkeypatch)
    with Session(engine) as session:
        before = session.execute(text("SHOW jit")).scalar_one()
        session.commit()
        sweep_batch(session, now=utcnow(), idle_minutes=0, keep_last=1, protected=(), batch_size=10)
        assert session.execute(text("SHOW jit")).scalar_one() == "off"
        session.commit()
        assert session.execute(text("SHOW jit")).scalar_one() == before
        without_jit(session)  # and what the batch calls turns it off again, for a transaction
        assert session.execute(text("SHOW jit")).scalar_one() == "off"
        session.rollback()
    engine.dispose()


@pytest.mark.parametrize("keep_last", [0, 3])
def test_the_sweep_probes_clearings_by_their_unique_index(
    sqlite_engine: Engine, keep_last: int
) -> None:
    """Every read of the clearings in the sweep's statement is a search of their unique index
    (conversation, message, stage), never a scan: a probe by message alone scanned the whole
    table for each candidate (an idle sweep over 1,000 conversations took minutes; quadratic)."""
    from recap.core.storage import sweep

    compiled = sweep._sweep_statement("sqlite", keep_last, False).compile(
        dialect=sqlite_engine.dialect
    )
    values = {"after_id": 0, "until_id": 10, "idle_before": utcnow(), "now": utcnow()}
    bound = compiled.construct_params(values)
    positions = tuple(bound.get(name) for name in compiled.positiontup or ())
    with sqlite_engine.connect() as connection:
        plan = connection.exec_driver_sql(
            "EXPLAIN QUERY PLAN " + str(compiled), positions
        ).fetchall()
    steps = [str(row[-1]) for row in plan]
    on_clearings = [s for s in steps if s.split()[1:2] in (["clearings"], ["taken"])]
    # one probe answers both "already cleared?" and "what does its aged form save?"
    assert len(on_clearings) == 1, steps
    assert all(
        s.startswith("SEARCH") and "conversation_id=? AND message_id=?" in s for s in on_clearings
    ), steps


def test_the_strays_check_searches_the_clearings(sqlite_engine: Engine) -> None:
    """The batch's read-back of the rows it filed (a range of message ids) searches an index
    (migration 0021 added one on ``message_id``): it scanned the whole table once per batch, so
    an idle sweep over a large store slowed with every clearing it had written."""
    from sqlalchemy import event

    from recap.core.storage import sweep

    def explain(conn: Any, cursor: Any, statement: str, *rest: Any) -> tuple[str, Any]:
        return "EXPLAIN QUERY PLAN " + statement, rest[0]  # the statement as it is sent

    values = {"after_id": 0, "until_id": 10, "now": utcnow(), "reborn": ["a", "b"]}
    with sqlite_engine.connect() as connection:
        event.listen(connection, "before_cursor_execute", explain, retval=True)
        plan = connection.execute(sweep._strays_statement(), values).fetchall()
        event.remove(connection, "before_cursor_execute", explain)
    steps = [str(row[-1]) for row in plan]
    assert any(s.startswith("SEARCH clearings USING") for s in steps), steps
    assert not any(s.startswith("SCAN clearings") for s in steps), steps
