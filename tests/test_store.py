"""The schema on SQLite and PostgreSQL: migrations, import/export, branches, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, inspect, select, text
from sqlmodel import Session

from recap.core import service
from recap.core.counting import tokens
from recap.core.settings import Settings
from recap.core.storage.db import session_scope
from recap.core.storage.migrate import current_revision, head_revision, schema_drift
from recap.core.storage.models import Message, Summary, utcnow
from tests.support.cli_helpers import assert_one_line_error, recap
from tests.support.data import DATA_FILES, load_data

TABLES = {"conversations", "messages", "summaries", "clearings", "compaction_log", "usage"}


def test_migrations_create_every_table(engine: Engine) -> None:
    """`upgrade` creates the whole schema and records its revision, on both databases."""
    assert set(inspect(engine).get_table_names()) >= TABLES
    assert current_revision(engine) == head_revision()


def test_migrations_match_the_models(engine: Engine) -> None:
    """The migrated schema is exactly what the models declare, on both databases."""
    assert schema_drift(engine) == []


def test_sqlite_keeps_autoincrement_on_every_table_whose_ids_are_never_reused(
    sqlite_engine: Engine,
) -> None:
    """Every table the models declare ``NEVER_REUSED`` has SQLite's AUTOINCREMENT once every
    migration ran (a migration that rebuilds a table must keep it: erased ids never return)."""
    from recap.core.storage.models import NEVER_REUSED, SQLModel

    declared = {
        name
        for name, table in SQLModel.metadata.tables.items()
        if all(table.dialect_kwargs.get(f"sqlite_{k[len('sqlite_') :]}") for k in NEVER_REUSED)
    }
    assert {"messages", "summaries", "clearings", "usage"} <= declared
    with sqlite_engine.connect() as connection:
        rows = connection.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
        created = {str(name): str(sql) for name, sql in rows}
    assert {name for name in declared if "AUTOINCREMENT" not in created[name]} == set()


def test_a_clearing_id_erased_before_the_attach_migration_never_returns(sqlite_url: str) -> None:
    """0016 rebuilds clearings on SQLite (its unique key gains the conversation): the highest id
    ever handed out survives the rebuild, though the row that held it was erased."""
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade

    engine = make_engine(sqlite_url)
    upgrade(engine, "0015")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO conversations (id, model, created_at, last_activity_at, dirty,"
                " incarnation) VALUES ('c', 'm', '2026-01-01', '2026-01-01', 0, 'x')"
            )
        )
        for message_id in (1, 2, 3):
            connection.execute(
                text(
                    "INSERT INTO clearings (conversation_id, message_id, reason, tokens_reclaimed,"
                    " created_at, stage) VALUES ('c', :m, 'idle', 1, '2026-01-01', 'cleared')"
                ),
                {"m": message_id},
            )
        connection.execute(text("DELETE FROM clearings WHERE id = 3"))
    upgrade(engine)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO clearings (conversation_id, message_id, reason, tokens_reclaimed,"
                " created_at, stage) VALUES ('c', 9, 'idle', 1, '2026-01-01', 'cleared')"
            )
        )
        newest = connection.execute(text("SELECT max(id) FROM clearings")).scalar_one()
    engine.dispose()
    assert newest == 4


def test_sqlite_uses_wal_and_busy_timeout(sqlite_engine: Engine) -> None:
    """SQLite connections run in WAL mode with a busy timeout."""
    with sqlite_engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() >= 1000


def test_summary_unique_per_cutoff(engine: Engine, settings: Settings) -> None:
    """The database itself refuses a second summary for the same (conversation, cutoff)."""
    records = [{"id": "c", "messages": [{"role": "user", "content": "hi"}]}]
    service.import_conversations(engine, records, settings)
    row = dict(
        conversation_id="c",
        cutoff_message_id=1,
        text="s",
        tokens=1,
        encoding="o200k_base",
        model="m",
        created_at=utcnow(),
    )
    with session_scope(engine) as session:
        session.add(Summary(**row))
    with pytest.raises(Exception, match=r"(?i)unique"), session_scope(engine) as session:
        session.add(Summary(**row))


def _roundtrip(engine: Engine, settings: Settings, records: list[dict[str, Any]]) -> None:
    imported = service.import_conversations(engine, records, settings)
    assert [n for _, n in imported] == [len(r["messages"]) for r in records]
    for record in records:
        exported = service.export_conversation(engine, record["id"])
        messages = [{k: v for k, v in m.items() if k != "id"} for m in exported["messages"]]
        assert messages == record["messages"]
        assert exported["source"] == record["source"]
        ids = [m["id"] for m in exported["messages"]]
        assert ids == sorted(ids)


def test_every_shared_conversation_roundtrips(sqlite_engine: Engine, settings: Settings) -> None:
    """All 244 conversations import with every message, and export gives them back."""
    total = 0
    for name in DATA_FILES:
        records = load_data(name)
        total += len(records)
        _roundtrip(sqlite_engine, settings, records)
    assert total == 244


def test_roundtrip_on_postgres(postgres_url: str, settings: Settings) -> None:
    """The same round trip holds on PostgreSQL (one file of each source)."""
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade

    engine = make_engine(postgres_url)
    upgrade(engine)
    for name in DATA_FILES:
        _roundtrip(engine, settings, load_data(name)[:3])


def test_stored_counts_match_tokenizer(sqlite_engine: Engine, settings: Settings) -> None:
    """Each message's stored count is its count at insert, with the encoding named."""
    record = load_data("openhands.jsonl")[0]
    service.import_conversations(sqlite_engine, [record], settings)
    with Session(sqlite_engine) as session:
        rows = session.exec(select(Message).order_by(Message.id)).all()  # type: ignore[call-overload]
    for (row,), message in zip(rows, record["messages"], strict=True):
        assert row.encoding == "o200k_base"
        assert row.tokens == tokens.count_message(message, "o200k_base")


def test_branches(engine: Engine, settings: Settings) -> None:
    """An edit is a sibling: each leaf has its own branch, the default is the latest message."""
    service.import_conversations(
        engine,
        [
            {
                "id": "b",
                "messages": [
                    {"role": "user", "content": "q1"},
                    {"role": "assistant", "content": "a1"},
                ],
            }
        ],
        settings,
    )
    first_leaf = service.add_message(engine, "b", {"role": "user", "content": "q2"})
    edit = service.add_message(engine, "b", {"role": "user", "content": "q2 edited"}, parent_id=2)
    reply = service.add_message(engine, "b", {"role": "assistant", "content": "a2"})
    latest = service.export_conversation(engine, "b")
    assert [m["content"] for m in latest["messages"]] == ["q1", "a1", "q2 edited", "a2"]
    assert latest["messages"][-1]["id"] == reply
    old = service.export_conversation(engine, "b", leaf=first_leaf)
    assert [m["content"] for m in old["messages"]] == ["q1", "a1", "q2"]
    assert edit > first_leaf


def _count_rows(engine: Engine) -> int:
    with engine.connect() as connection:
        return sum(
            connection.execute(select(func.count()).select_from(text(t))).scalar_one()
            for t in ("conversations", "messages")
        )


BAD_FILES = [
    ('{"messages": [{"role": "user", "content": "hi"}]}\n{not json}\n', "malformed JSON"),
    (
        '{"id": "x", "messages": [{"role": "tool", "content": "r", "tool_call_id": "c9"}]}\n',
        "answers no earlier call",
    ),
    ('{"id": "x", "messages": [{"role": "wizard", "content": "r"}]}\n', "unknown role"),
    ('{"id": "x", "messages": "nope"}\n', "messages"),
    ('{"id": "x", "messages": [{"role": "user", "content": 5}]}\n', "content"),
    (
        '{"id": "x", "messages": [{"role": "assistant", "content": null,'
        ' "tool_calls": [{"function": {"name": "f"}}]}]}\n',
        "string id",
    ),
    ('{"id": "d", "messages": []}\n{"id": "d", "messages": []}\n', "duplicate"),
]


@pytest.mark.parametrize(("content", "fragment"), BAD_FILES)
def test_bad_import_changes_nothing(
    sqlite_engine: Engine, tmp_path: Path, content: str, fragment: str
) -> None:
    """A bad file is one clear error and nothing of it is written (all or nothing)."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "messages": [{"role": "user", "content": "fine"}]}\n' + content)
    before = _count_rows(sqlite_engine)
    assert_one_line_error(recap("import", str(path), "--json"), fragment)
    assert _count_rows(sqlite_engine) == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["add", "nope", "--role", "user", "--content", "x"], "unknown conversation"),
        (
            ["add", "c", "--role", "tool", "--content", "x", "--tool-call-id", "zz"],
            "answers no earlier call",
        ),
        (["add", "c", "--role", "user", "--content", "x", "--parent", "999"], "999"),
        (["add", "c", "--role", "assistant", "--tool-calls", "[oops"], "malformed JSON"),
        (["add", "c", "--role", "user", "--content", "x", "--content-file", "f"], "not both"),
        (["add", "c", "--role", "user", "--content-file", "missing.txt"], "cannot read"),
        (["export", "nope"], "unknown conversation"),
        (["export", "c", "--leaf", "999"], "999"),
        (["stats", "nope"], "unknown conversation"),
        (["summaries", "nope"], "unknown conversation"),
        (["import", "missing.jsonl"], "cannot read"),
        (["import", "empty.jsonl"], "no conversations"),
        (["import", "ok.jsonl", "--model", "no-such-model"], "unknown model"),
        (["new", "--id", "c"], "already exists"),
    ],
)
def test_bad_commands_change_nothing(
    sqlite_engine: Engine, tmp_path: Path, args: list[str], fragment: str
) -> None:
    """Each kind of bad input: non-zero exit, one line on stderr, nothing written."""
    (tmp_path / "ok.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert recap("new", "--id", "c", "--json").code == 0
    before = _count_rows(sqlite_engine)
    assert_one_line_error(recap(*args), fragment)
    assert _count_rows(sqlite_engine) == before


def test_commands_before_init_say_so(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Using an empty database asks for `recap init` in one line."""
    monkeypatch.setenv("RECAP_DATABASE_URL", sqlite_url)
    assert_one_line_error(recap("add", "c", "--role", "user", "--content", "x"), "recap init")


def test_invalid_setting_is_one_line(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An invalid setting stops the command with one line naming the variable."""
    monkeypatch.setenv("RECAP_TRIGGER_RATIO", "7")
    assert_one_line_error(recap("stats", "c"), "RECAP_TRIGGER_RATIO")


def test_stats_count_what_the_request_carries(sqlite_engine: Engine, settings: Settings) -> None:
    """Under a summary, stats count the root system prompt (still sent), the summary and the
    messages after its cutoff; a provider reading for the same leaf makes the basis measured."""
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "first question " * 20},
        {"role": "assistant", "content": "first answer " * 20},
        {"role": "user", "content": "second question"},
    ]
    service.import_conversations(sqlite_engine, [{"id": "s", "messages": messages}], settings)
    with session_scope(sqlite_engine) as session:
        session.add(
            Summary(
                conversation_id="s",
                cutoff_message_id=3,
                text="summary",
                tokens=40,
                encoding="o200k_base",
                model="m",
                created_at=utcnow(),
            )
        )
    counts = [tokens.count_message(m, "o200k_base") for m in messages]
    stats = service.conversation_stats(sqlite_engine, "s", settings)
    assert stats["used"] == tokens.TOKENS_REPLY_PRIMING + counts[0] + 40 + counts[3]
    assert stats["basis"] == "estimated" and stats["window"] == 128_000
    service.record_usage(sqlite_engine, "s", prompt_tokens=stats["used"] + 7)
    measured = service.conversation_stats(sqlite_engine, "s", settings)
    assert measured["basis"] == "measured" and measured["used"] == stats["used"] + 7


def test_the_request_version_reads_the_messages_index_alone(sqlite_engine: Engine) -> None:
    """Each assembly's version read (per basis: count, highest id, token sum) is answered from
    the covering index of migration 0011, never from the message rows."""
    from recap.core.storage.versions import _BASES

    statement = select(_BASES).params(conversation_id="any")
    compiled = statement.compile(sqlite_engine, compile_kwargs={"literal_binds": True})
    with sqlite_engine.connect() as connection:
        plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}").all()
    steps = " | ".join(str(row[-1]) for row in plan)
    assert "COVERING INDEX ix_messages_conversation_version" in steps, steps


def test_the_tree_is_read_from_its_index_alone(sqlite_engine: Engine) -> None:
    """Each request's path read (every id, parent and stored count of the conversation, which
    tell what the budget can hold before a row is read) is answered from the tree index of
    migration 0012, never from the message rows."""
    from recap.core.storage import reads

    for statement in (reads._AGGREGATED_PARENTS["sqlite"], reads._PARENTS):
        bound = statement.params(conversation_id="any")
        text = bound.compile(sqlite_engine, compile_kwargs={"literal_binds": True})
        with sqlite_engine.connect() as connection:
            plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {text}").all()
        steps = " | ".join(str(row[-1]) for row in plan)
        assert "COVERING INDEX ix_messages_conversation_tree" in steps, steps
