"""Erasure, retention and the listing (``recap delete``, ``recap.expire_conversations``,
``recap conversations``) on SQLite and PostgreSQL, with real workers for the runs a delete meets.

"Nothing remains" is checked by query: every table of the database that has a
``conversation_id`` column holds no row of the conversation, and ``conversations`` no row of its
id; and no file of its own is left under the output folder, while a file it shares with another
conversation stays.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text, update

from recap.core import lifecycle, service
from recap.core.client import Recap
from recap.core.errors import NotFoundError
from recap.core.settings import SettingsError, get_settings, load_settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import CONVERSATIONS, utcnow
from recap.core.storage.sweep import apply_clearings
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from recap.workers.app import TASK_ROUTES, app, beat_schedule
from recap.workers.compress import DELETED_REASON
from recap.workers.lifecycle import EXPIRE_TASK
from tests.support.cli_helpers import assert_one_line_error, recap
from tests.test_compress_worker import chat, harness_for
from tests.test_media import data_url, image_part, png_bytes

WINDOW = 3_000
RESULT_TIMEOUT = 60
BIG_LINES = 2_500  # over RECAP_MAX_OUTPUT_LINES: the output is saved to a file on the way in


def big_output(tag: str) -> str:
    return "\n".join(f"{tag} line {i} " + "x" * 40 for i in range(BIG_LINES))


def tool_turn(call: str, output: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"run the tool for {call}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "grep", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": call, "name": "grep", "content": output},
        {"role": "assistant", "content": f"done with {call}"},
    ]


def rich_conversation(shared: str, own: str) -> list[dict[str, Any]]:
    """A system prompt, a stored screenshot, one output shared with another conversation, one of
    its own, and enough turns to be summarized."""
    screenshot = data_url(png_bytes(64, 64, pad=60_000, seed=7))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are careful."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "look at this"}, image_part(screenshot)],
        },
        {"role": "assistant", "content": "I see a grey square."},
    ]
    messages += tool_turn("call_shared", shared) + tool_turn("call_own", own)
    return messages + chat(12)[1:]


def remaining_rows(engine: Engine, conversation_id: str) -> dict[str, int]:
    """Rows of the conversation in every table of the database (as the database lists them)."""
    found: dict[str, int] = {}
    names = inspect(engine).get_table_names()
    with engine.connect() as connection:
        for name in names:
            columns = {c["name"] for c in inspect(engine).get_columns(name)}
            key = "id" if name == "conversations" else "conversation_id"
            if key not in columns:
                continue
            count = connection.execute(
                text(f"SELECT count(*) FROM {name} WHERE {key} = :c"), {"c": conversation_id}
            ).scalar()
            if count:
                found[name] = int(count)
    return found


def _output_names(engine: Engine) -> set[str]:
    """The file names of every saved output (not media) the messages name."""
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT output_path FROM messages WHERE output_path IS NOT NULL")
        )
        return {Path(row[0]).name for row in rows}


def files_under(root: Path) -> set[str]:
    return {p.name for p in root.rglob("*") if p.is_file()}


def fill(engine: Engine, cid: str, messages: list[dict[str, Any]]) -> Recap:
    """Import, then give the conversation a summary, clearings, usage, a profile and a log."""
    client = Recap(get_settings(), engine)
    service.import_conversations(
        engine,
        [{"id": cid, "messages": messages}],
        client.settings,
        max_input_tokens=WINDOW,
        prepare=client._ingest,
    )
    client.assemble(cid, system="You are careful.", reminder="be brief")
    client.record_usage(cid, prompt_tokens=1_000)
    done = client.compress(cid, force=True)
    assert done.action == "summarized", done
    exported = service.export_conversation(engine, cid)["messages"]
    results = [m["id"] for m in exported if m["role"] == "tool"]
    plan = ClearingPlan(
        "idle", tuple(PlannedClearing(message_id=mid, tokens_reclaimed=10) for mid in results)
    )
    with session_scope(engine) as session:
        assert apply_clearings(session, cid, plan).cleared == len(results)
    return client


# --- delete --------------------------------------------------------------------------------------


def test_delete_leaves_no_row_and_no_file_of_its_own(engine: Engine, settings: Any) -> None:
    """After a delete, no table holds a row of the conversation and none of its own files is
    left; the output it shared with another conversation stays, and that one is untouched."""
    root = get_settings().output_dir
    shared = big_output("shared")
    messages = rich_conversation(shared, big_output("own"))
    seen = messages[1:3]  # the same screenshot, in another conversation
    client = fill(engine, "gone", messages)
    service.import_conversations(
        engine,
        [{"id": "kept", "messages": tool_turn("c9", shared)}, {"id": "seen", "messages": seen}],
        client.settings,
        prepare=client._ingest,
    )
    before_files = files_under(root)
    assert len(before_files) == 3  # the screenshot, the shared output, its own output
    (screenshot,) = [n for n in before_files if n not in _output_names(engine)]
    assert set(remaining_rows(engine, "gone")) >= {
        "conversations",
        "messages",
        "summaries",
        "compaction_log",
        "usage",
        "request_profiles",
        "clearings",
    }
    kept_before = service.export_conversation(engine, "kept", full=True)

    done = client.delete("gone")
    assert done["deleted"] == "gone" and done["files"] == 1 and done["kept_shared_files"] == 2
    assert remaining_rows(engine, "gone") == {}
    left = files_under(root)
    assert len(left) == 2 and screenshot in left  # the output and the screenshot "seen" shares
    assert client.delete("seen")["files"] == 1 and screenshot not in files_under(root)
    assert service.export_conversation(engine, "kept", full=True) == kept_before
    assert kept_before["messages"][2]["content"] == shared  # its file is still read back
    with pytest.raises(NotFoundError):
        client.delete("gone")


def test_cli_delete_needs_yes_and_names_unknown_conversations(sqlite_engine: Engine) -> None:
    """Without --yes nothing is deleted (one line); an unknown conversation is one line."""
    service.import_conversations(sqlite_engine, [{"id": "c", "messages": chat(2)}], get_settings())
    assert_one_line_error(recap("delete", "c"), "--yes")
    assert remaining_rows(sqlite_engine, "c") == {"conversations": 1, "messages": 5}
    assert_one_line_error(recap("delete", "nope", "--yes"), "unknown conversation")
    payload = recap("delete", "c", "--yes", "--json").json()
    assert payload["deleted"] == "c" and payload["messages"] == 5
    assert remaining_rows(sqlite_engine, "c") == {}


# --- runs that meet a delete ----------------------------------------------------------------------


@pytest.mark.redis
def test_running_compression_finds_its_conversation_gone_and_writes_nothing(
    db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose model call is in flight when the conversation is deleted ends as skipped,
    and no summary, log row or lease of it is written; a run queued for it later skips too."""
    from tests.support.llm_server import Reply

    with harness_for(db_url, redis_url, monkeypatch) as h:
        cid = h.new(turns=12)
        h.server.script(Reply(hold=True))
        sent = app.send_task("recap.compress_session", args=[cid])
        assert h.server.wait_for(1), "the run never called the model"
        Recap(h.settings, h.engine).delete(cid)
        h.server.release()
        done = sent.get(timeout=RESULT_TIMEOUT)
        assert done["action"] == "skipped" and done["reason"] == DELETED_REASON, done
        assert remaining_rows(h.engine, cid) == {}

        queued = h.compress(cid)
        assert queued["action"] == "skipped" and cid in queued["reason"], queued
        assert remaining_rows(h.engine, cid) == {}
        assert len(h.server.requests) == 1


# --- retention -----------------------------------------------------------------------------------


def _age(engine: Engine, cid: str, days: float) -> None:
    with engine.begin() as connection:
        connection.execute(
            update(CONVERSATIONS)
            .where(CONVERSATIONS.c.id == cid)
            .values(last_activity_at=utcnow() - timedelta(days=days))
        )


@pytest.mark.redis
def test_retention_by_the_worker_deletes_idle_conversations_only(
    db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``recap.expire_conversations`` on a real worker deletes the conversations idle past
    RECAP_CONVERSATION_RETENTION_DAYS, rows and files, and keeps the active one; a batch that
    is full re-enqueues the rest."""
    env = {"RECAP_CONVERSATION_RETENTION_DAYS": "30"}
    with harness_for(db_url, redis_url, monkeypatch, **env) as h:
        client = Recap(h.settings, h.engine)
        root = h.settings.output_dir
        idle = [f"idle-{n}" for n in range(3)]
        for n, cid in enumerate(idle):
            service.import_conversations(
                h.engine,
                [{"id": cid, "messages": tool_turn("c", big_output(f"idle{n}"))}],
                h.settings,
                prepare=client._ingest,
            )
            _age(h.engine, cid, 31 + n)
        active = h.new(turns=2, cid="active")
        _age(h.engine, active, 29)
        assert len(files_under(root)) == 3

        monkeypatch.setattr(lifecycle, "EXPIRE_BATCH", 2)  # the worker is a thread of this test
        first = app.send_task(EXPIRE_TASK).get(timeout=RESULT_TIMEOUT)
        assert first["deleted"] == 2 and first["more"] is True
        second = app.AsyncResult(first["next_task_id"]).get(timeout=RESULT_TIMEOUT)
        assert second["deleted"] == 1 and second["more"] is False
        for cid in idle:
            assert remaining_rows(h.engine, cid) == {}
        assert files_under(root) == set()
        assert remaining_rows(h.engine, active) == {"conversations": 1, "messages": 5}


def test_retention_unset_keeps_everything_and_beat_runs_it(sqlite_engine: Engine) -> None:
    """Unset, the retention deletes nothing; beat runs the task on the maintenance queue; a
    retention of zero days or less is refused at start."""
    service.import_conversations(
        sqlite_engine, [{"id": "old", "messages": chat(2)}], get_settings()
    )
    _age(sqlite_engine, "old", 10_000)
    assert lifecycle.expire(sqlite_engine, get_settings()).as_dict()["deleted"] == 0
    assert remaining_rows(sqlite_engine, "old") == {"conversations": 1, "messages": 5}
    entry = beat_schedule(get_settings())["expire-conversations"]
    assert entry["task"] == EXPIRE_TASK and TASK_ROUTES[EXPIRE_TASK]["queue"] == "maintenance"
    with pytest.raises(SettingsError, match="RECAP_CONVERSATION_RETENTION_DAYS"):
        load_settings(conversation_retention_days=0)
    assert_one_line_error(recap("expire", "--yes"), "RECAP_CONVERSATION_RETENTION_DAYS")
    payload = recap("expire", "--retention-days", "30", "--yes", "--json").json()
    assert payload["deleted"] == 1 and remaining_rows(sqlite_engine, "old") == {}


# --- listing -------------------------------------------------------------------------------------


def test_conversations_pages_in_id_order_with_idle_filter(engine: Engine) -> None:
    """Pages follow the cursor in id order, each with its counts and pressure; --idle-days
    keeps the conversations idle longer."""
    ids = sorted(f"conv-{uuid.uuid4().hex[:6]}" for _ in range(5))
    for n, cid in enumerate(ids):
        service.import_conversations(engine, [{"id": cid, "messages": chat(n + 1)}], get_settings())
    _age(engine, ids[1], 5)
    _age(engine, ids[3], 9)
    seen: list[dict[str, Any]] = []
    cursor: list[str] = []
    while True:
        page = recap("conversations", "--limit", "2", "--json", *cursor).json()
        seen += page["conversations"]
        if page["next"] is None:
            break
        cursor = ["--after", page["next"]]
    assert [c["id"] for c in seen] == ids
    assert [c["messages"] for c in seen] == [3, 5, 7, 9, 11]
    assert all(c["tokens"] > 0 and 0 < c["pressure"] < 1 for c in seen)
    idle = recap("conversations", "--idle-days", "4", "--json").json()["conversations"]
    assert [c["id"] for c in idle] == [ids[1], ids[3]]
    assert recap("conversations", "--idle-days", "100", "--json").json() == {
        "conversations": [],
        "next": None,
    }
    assert_one_line_error(recap("conversations", "--idle-days", "nan"), "idle-days")
    assert_one_line_error(recap("conversations", "--limit", "0"), "limit")


def test_listing_reads_one_page(sqlite_engine: Engine) -> None:
    """The listing's SQL is bounded by the page: the statements it runs carry a LIMIT."""
    from sqlalchemy import event

    seen: list[str] = []

    def record(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    for n in range(3):
        service.import_conversations(
            sqlite_engine, [{"id": f"c{n}", "messages": chat(1)}], get_settings()
        )
    event.listen(sqlite_engine, "before_cursor_execute", record)
    try:
        from recap.core.storage.erase import list_conversations

        rows, following = list_conversations(sqlite_engine, limit=2)
    finally:
        event.remove(sqlite_engine, "before_cursor_execute", record)
    assert [r.id for r in rows] == ["c0", "c1"] and following == "c1"
    heads = [s for s in seen if "FROM conversations" in s]
    assert heads and all("LIMIT" in s for s in heads)
    assert json.dumps([r.messages for r in rows]) == "[3, 3]"
