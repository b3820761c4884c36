"""Bad input anywhere on the CLI: one line on stderr, a non-zero exit, nothing written or deleted.

One row per input. Each runs against a seeded database and output folder; the test compares a
snapshot of every table's rows, of the saved output files (content and times) and of the files
around them before and after. Rows marked ``BOTH`` hit a limit PostgreSQL enforces (a 32-bit
column, VARCHAR(255), no NUL in text) and run on PostgreSQL too: the same input is refused the
same way on SQLite, so behaviour does not depend on the database.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from recap.core.errors import InputError, SchemaMissingError
from recap.core.settings import get_settings
from recap.core.storage.db import dispose_engines, make_engine
from recap.core.values import limits
from tests.support.cli_helpers import FAILED, assert_refused, recap, run_with_paths, snapshot
from tests.support.data import migrated

USAGE = 2  # click's exit code for a usage error (bad option value, missing option)
OVER_INT64 = str(2**63)
OVER_INT32 = str(2**31)
DEEP = 100_000  # nesting of the deep JSON inputs
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
SEED = {
    "id": "c",
    "messages": [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "saved output line\n" * 4_000},
        {"role": "assistant", "content": "Done."},
    ],
}


@dataclass(frozen=True)
class Row:
    """One bad input: the arguments, the exit code, a fragment of the one stderr line."""

    name: str
    args: tuple[str, ...]
    code: int
    fragment: str
    env: dict[str, str] = field(default_factory=dict)
    both: bool = False  # run on PostgreSQL too
    process: bool = False  # run as a child process (the Celery app reads its broker at import)


def _files(tmp: Path) -> dict[str, str]:
    """The input files the rows name, written under ``tmp``; placeholders to their paths."""
    good_then_bad = [
        {"id": "g", "messages": [*SEED["messages"][:2], _tool("fresh output line\n" * 4_000)]},
        {"id": "c", "messages": []},  # refused once the first record's output is saved
    ]
    contents: dict[str, str | bytes] = {
        "deep_json": "[" * DEEP + "]" * DEEP,
        "deep_import": '{"messages": ' + "[" * DEEP + "]" * DEEP + "}\n",
        "nul_text": "before\x00after",
        "nul_import": _line({"messages": [{"role": "user", "content": "a\x00b"}]}),
        "surrogate_import": '{"messages": [{"role": "user", "content": "\\ud800"}]}\n',
        "nan_import": '{"messages": [{"role": "user", "content": "x", "score": NaN}]}\n',
        "long_id_import": _line({"id": "x" * 256, "messages": []}),
        "list_id_import": _line({"id": ["x"], "messages": []}),
        "not_object_import": "[1, 2]\n",
        "bad_role_import": _line({"messages": [{"role": "robot", "content": "x"}]}),
        "bad_content_import": _line({"messages": [{"role": "user", "content": 5}]}),
        "deep_meta_import": _line({"messages": [], "meta": _nested(limits.JSON_MAX_DEPTH + 1)}),
        "good_then_bad_import": "".join(_line(r) for r in good_then_bad),
        "empty_import": "",
        "binary": bytes(range(256)),
        "tools_not_list": '{"tools": 5}',
    }
    paths = {"dir": str(tmp), "missing": str(tmp / "no-such-file")}
    for key, content in contents.items():
        path = tmp / f"{key}.input"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
        paths[key] = str(path)
    (tmp / "a-file").write_text("not a folder")
    paths["missing_db"] = f"sqlite:///{tmp / 'missing.db'}"
    paths["under_file_db"] = f"sqlite:///{tmp / 'a-file' / 'r.db'}"
    return paths


def _tool(content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_1", "content": content}


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _rows() -> list[Row]:
    return [
        *_integer_rows(),
        *_float_rows(),
        *_setting_rows(),
        *_database_rows(),
        *_json_rows(),
        *_text_rows(),
        *_file_rows(),
        *_usage_rows(),
        *_broker_rows(),
    ]


def _integer_rows() -> list[Row]:
    add = ("add", "c", "--role", "user", "--content", "x")
    return [
        Row("parent-over-int64", (*add, "--parent", OVER_INT64), USAGE, "--parent"),
        Row("parent-zero", (*add, "--parent", "0"), USAGE, "--parent"),
        Row("parent-not-number", (*add, "--parent", "abc"), USAGE, "--parent"),
        Row("export-leaf-over-int64", ("export", "c", "--leaf", OVER_INT64), USAGE, "--leaf"),
        Row("stats-leaf-huge", ("stats", "c", "--leaf", "9" * 30), USAGE, "--leaf"),
        Row("assemble-leaf-negative", ("assemble", "c", "--leaf", "-1"), USAGE, "--leaf"),
        Row("compress-leaf-over-int64", ("compress", "c", "--leaf", OVER_INT64), USAGE, "--leaf"),
        Row(
            "usage-leaf-over-int64",
            ("usage", "c", "--prompt-tokens", "5", "--leaf", OVER_INT64),
            USAGE,
            "--leaf",
        ),
        Row(
            "assemble-window-zero",
            ("assemble", "c", "--max-input-tokens", "0"),
            USAGE,
            "--max-input-tokens",
        ),
        Row(
            "new-window-over-int32",
            ("new", "--id", "n", "--max-input-tokens", OVER_INT32),
            USAGE,
            "--max-input-tokens",
            both=True,
        ),
        Row(
            "new-window-over-int64",
            ("new", "--id", "n", "--max-input-tokens", OVER_INT64),
            USAGE,
            "--max-input-tokens",
        ),
        Row(
            "import-window-zero",
            ("import", "{good_then_bad_import}", "--max-input-tokens", "0"),
            USAGE,
            "--max-input-tokens",
        ),
        Row(
            "usage-over-int32",
            ("usage", "c", "--prompt-tokens", OVER_INT32),
            USAGE,
            "--prompt-tokens",
            both=True,
        ),
        Row("usage-negative", ("usage", "c", "--prompt-tokens", "-1"), USAGE, "--prompt-tokens"),
        Row(
            "usage-cached-over-int32",
            ("usage", "c", "--prompt-tokens", "1", "--cached-tokens", OVER_INT32),
            USAGE,
            "--cached-tokens",
        ),
        Row(
            "replay-window-zero",
            ("replay", "{good_then_bad_import}", "--window", "0"),
            USAGE,
            "--window",
        ),
        Row("demo-window-over-int32", ("demo", "--window", OVER_INT32), USAGE, "--window"),
    ]


def _float_rows() -> list[Row]:
    return [
        Row("cleanup-nan", ("cleanup", "--retention-days", "nan"), USAGE, "--retention-days"),
        Row("cleanup-inf", ("cleanup", "--retention-days", "inf"), USAGE, "--retention-days"),
        Row("cleanup-negative", ("cleanup", "--retention-days", "-1"), USAGE, "--retention-days"),
        Row("cleanup-word", ("cleanup", "--retention-days", "week"), USAGE, "--retention-days"),
        Row("sweep-nan", ("sweep", "--idle-minutes", "nan"), USAGE, "--idle-minutes"),
        Row("sweep-negative", ("sweep", "--idle-minutes", "-1"), USAGE, "--idle-minutes"),
        Row("sweep-huge", ("sweep", "--idle-minutes", "1e300"), USAGE, "--idle-minutes"),
    ]


def _setting_rows() -> list[Row]:
    def setting(name: str, value: str, *args: str) -> Row:
        return Row(f"setting-{name.lower()}-{value}", args, FAILED, name, env={name: value})

    return [
        setting("RECAP_LLM_TIMEOUT", "inf", "stats", "c"),
        setting("RECAP_LLM_TIMEOUT", "nan", "stats", "c"),
        setting("RECAP_FAILURE_COOLDOWN_MINUTES", "inf", "stats", "c"),
        setting("RECAP_OUTPUT_RETENTION_DAYS", "nan", "cleanup"),
        setting("RECAP_OUTPUT_RETENTION_DAYS", "-inf", "cleanup"),
        setting("RECAP_IDLE_MINUTES", "1e300", "sweep"),
        setting("RECAP_SWEEP_BATCH_SIZE", "9" * 20, "sweep"),
        setting("RECAP_TASK_TIME_LIMIT", OVER_INT32, "stats", "c"),
        setting("RECAP_TRIGGER_RATIO", "nan", "stats", "c"),
        setting("RECAP_DATABASE_URL", "foo://bar", "stats", "c"),
        setting("RECAP_DATABASE_URL", "sqlite:////proc/recap-test/r.db", "init"),
        setting("RECAP_DATABASE_URL", "{under_file_db}", "init"),
    ]


def _database_rows() -> list[Row]:
    """Every command on a database file that does not exist: told to run init, no file made."""
    commands = [
        ("export", "c"),
        ("stats", "c"),
        ("assemble", "c"),
        ("summaries", "c"),
        ("failures",),
        ("usage", "c", "--prompt-tokens", "1"),
        ("add", "c", "--role", "user", "--content", "x"),
        ("new", "--id", "n"),
        ("import", "{good_then_bad_import}"),
        ("sweep",),
    ]
    return [
        Row(
            f"missing-db-{args[0]}",
            args,
            FAILED,
            "recap init",
            env={"RECAP_DATABASE_URL": "{missing_db}"},
        )
        for args in commands
    ]


def _json_rows() -> list[Row]:
    assistant = ("add", "c", "--role", "assistant", "--tool-calls")
    return [
        Row("tool-calls-deep", (*assistant, "{deep_json_text}"), FAILED, "nested"),
        Row("import-deep", ("import", "{deep_import}"), FAILED, "nested"),
        Row("tools-file-deep", ("assemble", "c", "--tools", "{deep_json}"), FAILED, "nested"),
        Row("import-meta-deep", ("import", "{deep_meta_import}"), FAILED, "nested"),
        Row("tool-calls-malformed", (*assistant, '{"a":'), FAILED, "malformed JSON"),
        Row("tool-calls-nan", (*assistant, "[NaN]"), FAILED, "NaN"),
        Row("tool-calls-not-list", (*assistant, '"x"'), FAILED, "must be a list"),
        Row("tool-calls-no-id", (*assistant, '[{"id": 5}]'), FAILED, "string id"),
        Row("import-nan", ("import", "{nan_import}"), FAILED, "NaN"),
        Row("import-id-list", ("import", "{list_id_import}"), FAILED, "'id'"),
        Row("import-not-object", ("import", "{not_object_import}"), FAILED, "messages"),
        Row("import-bad-role", ("import", "{bad_role_import}"), FAILED, "unknown role"),
        Row("import-content-number", ("import", "{bad_content_import}"), FAILED, "content"),
        Row(
            "tools-not-list",
            ("assemble", "c", "--tools", "{tools_not_list}"),
            FAILED,
            "tool schemas",
        ),
        Row(
            "import-fails-after-good-record",
            ("import", "{good_then_bad_import}"),
            FAILED,
            "'c' already exists",
            both=True,
        ),
    ]


def _text_rows() -> list[Row]:
    add = ("add", "c", "--role")
    return [
        Row(
            "content-file-nul",
            (*add, "user", "--content-file", "{nul_text}"),
            FAILED,
            "message: content contains a NUL character",
            both=True,
        ),
        Row("import-nul", ("import", "{nul_import}"), FAILED, "content contains a NUL", both=True),
        Row("import-surrogate", ("import", "{surrogate_import}"), FAILED, "surrogate", both=True),
        Row("new-id-256", ("new", "--id", "x" * 256), FAILED, "conversation id is 256", both=True),
        Row("import-id-256", ("import", "{long_id_import}"), FAILED, "id is 256", both=True),
        Row(
            "new-model-256",
            ("new", "--id", "n", "--model", "m" * 256, "--max-input-tokens", "1000"),
            FAILED,
            "model is 256",
            both=True,
        ),
        Row(
            "tool-call-id-256",
            (*add, "tool", "--tool-call-id", "t" * 256, "--content", "x"),
            FAILED,
            "tool_call_id is 256",
            both=True,
        ),
        Row(
            "name-300",
            (*add, "user", "--name", "n" * 300, "--content", "x"),
            FAILED,
            "name is 300",
            both=True,
        ),
        Row("unknown-role", (*add, "wizard", "--content", "x"), FAILED, "unknown role"),
        Row("empty-role", (*add, "", "--content", "x"), FAILED, "unknown role"),
        Row(
            "tool-without-call",
            (*add, "tool", "--tool-call-id", "nope", "--content", "x"),
            FAILED,
            "answers no earlier call",
        ),
        Row(
            "unknown-conversation",
            ("add", "nope", "--role", "user", "--content", "x"),
            FAILED,
            "unknown conversation",
        ),
        Row("export-unknown", ("export", "nope"), FAILED, "unknown conversation"),
        Row(
            "leaf-not-in-conversation",
            ("export", "c", "--leaf", "999999"),
            FAILED,
            "not in conversation",
        ),
        Row("conversation-exists", ("new", "--id", "c"), FAILED, "already exists"),
        Row(
            "unknown-model",
            ("new", "--id", "n", "--model", "no-such-model-xyz"),
            FAILED,
            "no-such-model-xyz",
        ),
        Row(
            "content-and-file",
            (*add, "user", "--content", "x", "--content-file", "{nul_text}"),
            FAILED,
            "not both",
        ),
    ]


def _file_rows() -> list[Row]:
    add_file = ("add", "c", "--role", "user", "--content-file")
    return [
        Row("content-file-missing", (*add_file, "{missing}"), FAILED, "cannot read"),
        Row("content-file-directory", (*add_file, "{dir}"), FAILED, "cannot read"),
        Row("content-file-binary", (*add_file, "{binary}"), FAILED, "cannot read"),
        Row("import-missing", ("import", "{missing}"), FAILED, "cannot read"),
        Row("import-directory", ("import", "{dir}"), FAILED, "cannot read"),
        Row("import-binary", ("import", "{binary}"), FAILED, "cannot read"),
        Row("import-empty", ("import", "{empty_import}"), FAILED, "no conversations"),
        Row("replay-missing", ("replay", "{missing}"), FAILED, "cannot read"),
        Row("tools-missing", ("assemble", "c", "--tools", "{missing}"), FAILED, "cannot read"),
        Row(
            "context-file-directory",
            ("assemble", "c", "--context-file", "{dir}"),
            FAILED,
            "cannot read",
        ),
    ]


def _usage_rows() -> list[Row]:
    return [
        Row("missing-option", ("add", "c", "--content", "x"), USAGE, "--role"),
        Row("unknown-option", ("add", "c", "--bogus"), USAGE, "--bogus"),
        Row("unknown-command", ("frobnicate",), USAGE, "frobnicate"),
        Row("missing-argument", ("export",), USAGE, "CONVERSATION"),
    ]


def _broker_rows() -> list[Row]:
    down = {"RECAP_BROKER_URL": "redis://127.0.0.1:1/0"}
    return [
        Row(
            "enqueue-broker-down",
            ("compress", "c", "--enqueue"),
            FAILED,
            "broker",
            env=down,
            process=True,
        ),
        Row("reconcile-broker-down", ("reconcile",), FAILED, "broker", env=down, process=True),
    ]


ROWS = _rows()
CASES = [
    pytest.param(row, kind, id=f"{row.name}-{kind}")
    for row in ROWS
    for kind in (("sqlite", "postgres") if row.both else ("sqlite",))
]


@pytest.fixture
def seeded(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A database of the row's kind with conversation ``c`` (and one saved tool output), the
    input files, and the environment the rows expect."""
    kind = request.param
    url = str(request.getfixturevalue("sqlite_url" if kind == "sqlite" else "postgres_url"))
    migrated(url, monkeypatch).dispose()  # the schema `recap init` makes, from the run's template
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    paths = _files(inputs)
    paths["deep_json_text"] = (inputs / "deep_json.input").read_text()
    seed = inputs / "seed.jsonl"
    seed.write_text(_line(SEED))
    assert recap("import", str(seed)).code == 0, "the seed import failed"
    saved = [p for p in (tmp_path / "outputs").rglob("*.txt")]
    assert saved, "the seed wrote no tool output, so a deletion would go unnoticed"
    return make_engine(url), paths


@pytest.mark.parametrize(
    ("row", "seeded"),
    [(c.values[0], c.values[1]) for c in CASES],
    ids=[c.id for c in CASES],
    indirect=["seeded"],
)
def test_bad_input_is_one_line_and_changes_nothing(
    row: Row, seeded: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The exact exit code, exactly one non-empty stderr line naming the problem, no traceback,
    and the same rows and files afterwards."""
    engine, paths = seeded
    before = snapshot(engine, tmp_path)
    result = run_with_paths(row.args, row.env, paths, monkeypatch, process=row.process)
    assert_refused(result, row.code, row.fragment)
    get_settings.cache_clear()
    assert snapshot(engine, tmp_path) == before


def test_limits_match_the_columns() -> None:
    """The bounds the CLI and the checks use are those of the columns in core.storage.models."""
    from sqlalchemy import BigInteger, Integer

    from recap.core.storage.models import CONVERSATIONS, MESSAGES, SQLModel

    assert MESSAGES.c.id.type.__class__ is BigInteger  # 64-bit on PostgreSQL: MESSAGE_ID_MAX
    assert limits.MESSAGE_ID_MAX == 2**63 - 1
    window = CONVERSATIONS.c.max_input_tokens.type
    assert isinstance(window, Integer) and not isinstance(window, BigInteger)
    assert limits.TOKENS_MAX == 2**31 - 1
    for column in (
        CONVERSATIONS.c.id,
        CONVERSATIONS.c.model,
        MESSAGES.c.tool_call_id,
        MESSAGES.c.name,
    ):
        assert getattr(column.type, "length", None) == limits.NAME_MAX_CHARS, column
    widths = {
        type(column.type)
        for table in SQLModel.metadata.tables.values()
        for column in table.columns
        if isinstance(column.type, Integer)
    }
    assert widths <= {Integer, BigInteger}, widths  # no SmallInteger: no third bound to check


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"content": "a\x00b"}, "NUL"),
        ({"content": "\ud800"}, "surrogate"),
        ({"score": float("nan")}, "finite"),
        ({"score": float("inf")}, "finite"),
        ({"meta": _nested(limits.JSON_MAX_DEPTH + 1)}, "nested"),
        ({"meta": _nested(50_000)}, "nested"),
        ({"meta": {1: "x"}}, "non-string key"),
        ({"meta": {"k\x00": "x"}}, "NUL"),
        ({"when": object()}, "not a JSON value"),
    ],
)
def test_check_value_refuses_what_a_database_cannot_store(value: Any, fragment: str) -> None:
    """Each value a message could carry that one of the databases cannot hold is refused."""
    with pytest.raises(InputError, match=fragment):
        limits.check_value(value, "message")


@pytest.mark.parametrize(
    "value",
    [
        {"content": "plain", "parts": [{"type": "text", "text": "é ✓ 𝄞"}], "n": 2**70},
        {"meta": _nested(limits.JSON_MAX_DEPTH - 1)},
        {"score": 1.5, "flag": True, "none": None},
    ],
)
def test_check_value_accepts_what_both_databases_store(value: Any) -> None:
    """Ordinary messages, deep-but-allowed nesting and big integers inside JSON pass."""
    limits.check_value(value, "message")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("{", "malformed JSON"), ("[NaN]", "NaN"), ("[Infinity]", "Infinity"), ("[" * DEEP, "nested")],
)
def test_loads_turns_every_bad_document_into_one_input_error(text: str, fragment: str) -> None:
    """Malformed text, non-JSON constants and any depth are an InputError, never a crash."""
    with pytest.raises(InputError, match=fragment):
        limits.loads(text, "input")


def test_client_on_an_uninitialized_database(tmp_path: Path) -> None:
    """``Recap()`` says run `recap init` in one line and creates no file; ``create_schema``
    creates the schema, after which it works."""
    from recap.core.client import Recap
    from recap.core.settings import load_settings

    path = tmp_path / "host.db"
    settings = load_settings(database_url=f"sqlite:///{path}")
    with pytest.raises(SchemaMissingError, match="recap init") as missing:
        Recap(settings)
    assert "\n" not in str(missing.value) and not path.exists()
    path.touch()  # an empty file: a database without the schema
    with pytest.raises(SchemaMissingError, match="recap init"):
        Recap(settings)
    dispose_engines()
    path.unlink()
    recap_host = Recap(settings, create_schema=True)
    assert recap_host.new("x") == "x"
    assert Recap(settings).stats("x")["used"] >= 0


def test_client_on_an_uninitialized_postgres(postgres_url: str) -> None:
    """The same on PostgreSQL: an empty database is refused, then created on request."""
    from recap.core.client import Recap
    from recap.core.settings import load_settings

    settings = load_settings(database_url=postgres_url)
    with pytest.raises(SchemaMissingError, match="recap init"):
        Recap(settings)
    assert Recap(settings, create_schema=True).new("x") == "x"


def test_failed_import_keeps_files_it_did_not_create(sqlite_engine: Engine, tmp_path: Path) -> None:
    """An import that fails deletes the output it wrote, and gives a file that already held the
    same content its old time back, instead of deleting it."""
    seed = tmp_path / "seed.jsonl"
    seed.write_text(_line(SEED))
    assert recap("import", str(seed)).code == 0
    (saved,) = list((tmp_path / "outputs").rglob("*.txt"))
    os.utime(saved, ns=(1_000_000_000, 1_000_000_000))
    same_then_bad = [
        {"id": "again", "messages": SEED["messages"]},
        {"id": "c", "messages": []},  # exists: refused after the first record saved its output
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(_line(r) for r in same_then_bad))
    assert recap("import", str(bad)).code == FAILED
    assert list((tmp_path / "outputs").rglob("*.txt")) == [saved]
    assert saved.stat().st_mtime_ns == 1_000_000_000
