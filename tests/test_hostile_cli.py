"""Hostile input on the command line: one stderr line, a non-zero exit, nothing changed.

One row per input an unlucky operator or a hostile file gives a command: endless files
(``/dev/zero``), files over ``RECAP_MAX_INPUT_BYTES``, an assemble that does not fit, a broker URL
no transport knows, messages no provider accepts. Each runs against a seeded database (one
conversation, one saved tool output, a recorded request profile) and the test compares every
table's rows and every file under the test's folder before and after.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from recap.core.settings import get_settings
from recap.core.storage.db import make_engine
from tests.support.cli_helpers import (
    FAILED,
    assert_refused,
    recap,
    recap_process,
    run_with_paths,
    snapshot,
)
from tests.support.data import migrated

CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
SEED = {
    "id": "c",
    "messages": [
        {"role": "user", "content": "List the files. " * 40},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "saved output line\n" * 4_000},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Now read the README, please. " * 20},
    ],
}
SMALL_LIMIT = "2048"  # RECAP_MAX_INPUT_BYTES for the rows with a file just over it
BOGUS_BROKER = {"RECAP_BROKER_URL": "bogus://x"}


@dataclass(frozen=True)
class Row:
    """One bad input: the arguments, a fragment of the one stderr line, the environment."""

    name: str
    args: tuple[str, ...]
    fragment: str
    env: dict[str, str] = field(default_factory=dict)
    process: bool = False  # run as a child process (the Celery app reads its broker at import)


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def _record(*messages: dict[str, Any], cid: str = "n", **extra: Any) -> str:
    return _line({"id": cid, "messages": list(messages), **extra})


USER = {"role": "user", "content": "hi"}


def _inputs(folder: Path) -> dict[str, str]:
    """The input files the rows name, written under ``folder``; placeholders to their paths."""
    contents = {
        "big_text": "x" * (int(SMALL_LIMIT) + 1),
        "big_import": _record({"role": "user", "content": "x" * int(SMALL_LIMIT)}),
        "id_true": _line({"id": True, "messages": [USER]}),
        "id_number": _line({"id": 5, "messages": [USER]}),
        "id_float": _line({"id": 1.5, "messages": [USER]}),
        "message_id_true": _record({**USER, "id": True}),
        "message_id_list": _record({**USER, "id": ["x"]}),
        "user_null": _record({"role": "user", "content": None}),
        "user_missing": _record({"role": "user"}),
        "system_null": _record({"role": "system", "content": None}),
        "assistant_null": _record(USER, {"role": "assistant", "content": None}),
        "assistant_empty_calls": _record(
            USER, {"role": "assistant", "content": None, "tool_calls": []}
        ),
        "tool_null": _record(
            USER,
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": None},
        ),
        "parts_numbers": _record({"role": "user", "content": [1, 2]}),
        "part_unknown": _record({"role": "user", "content": [{"type": "zzz"}]}),
        "part_no_type": _record({"role": "user", "content": [{"text": "x"}]}),
        "part_text_missing": _record({"role": "user", "content": [{"type": "text"}]}),
        "part_text_number": _record({"role": "user", "content": [{"type": "text", "text": 5}]}),
        "content_object": _record({"role": "user", "content": {"weird": 1}}),
        "big_number": _record(USER, temperature=1.5).replace("1.5", "1e999"),  # parses as inf
        "good_then_unknown_part": _record(USER, cid="g")
        + _record({"role": "user", "content": [{"type": "zzz"}]}),
        "tools": json.dumps([{"type": "function", "function": {"name": "t", "parameters": {}}}]),
    }
    paths = {"zero": "/dev/zero"}
    for key, text in contents.items():
        path = folder / f"{key}.input"
        path.write_text(text, encoding="utf-8")
        paths[key] = str(path)
    return paths


def _file_rows() -> list[Row]:
    """Endless and oversized files: one line naming the limit, read no further than it."""
    small = {"RECAP_MAX_INPUT_BYTES": SMALL_LIMIT}
    add_file = ("add", "c", "--role", "user", "--content-file")
    return [
        Row("import-dev-zero", ("import", "{zero}"), "RECAP_MAX_INPUT_BYTES"),
        Row("content-file-dev-zero", (*add_file, "{zero}"), "RECAP_MAX_INPUT_BYTES"),
        Row("tools-dev-zero", ("assemble", "c", "--tools", "{zero}"), "RECAP_MAX_INPUT_BYTES"),
        Row(
            "context-file-dev-zero",
            ("assemble", "c", "--context-file", "{zero}"),
            "RECAP_MAX_INPUT_BYTES",
        ),
        Row("replay-dev-zero", ("replay", "{zero}"), "RECAP_MAX_INPUT_BYTES"),
        Row("import-over-limit", ("import", "{big_import}"), "RECAP_MAX_INPUT_BYTES", small),
        Row("content-file-over-limit", (*add_file, "{big_text}"), "RECAP_MAX_INPUT_BYTES", small),
        Row(
            "context-file-over-limit",
            ("assemble", "c", "--context-file", "{big_text}"),
            "RECAP_MAX_INPUT_BYTES",
            small,
        ),
    ]


def _setting_rows() -> list[Row]:
    """The size limit and the broker URL are checked when a command starts."""

    def setting(name: str, value: str, *args: str, process: bool = False) -> Row:
        return Row(f"{name.lower()}-{value}", args, name, {name: value}, process)

    return [
        setting("RECAP_MAX_INPUT_BYTES", "0", "import", "{big_import}"),
        setting("RECAP_MAX_INPUT_BYTES", "-5", "add", "c", "--role", "user", "--content", "x"),
        setting("RECAP_MAX_INPUT_BYTES", "lots", "import", "{big_import}"),
        setting("RECAP_MAX_INPUT_BYTES", "1e3", "import", "{big_import}"),
        setting("RECAP_BROKER_URL", "bogus://x", "compress", "c", "--enqueue", process=True),
        setting("RECAP_BROKER_URL", "bogus://x", "reconcile", process=True),
        setting("RECAP_BROKER_URL", "bogus://x", "retry", "c", process=True),
        setting("RECAP_BROKER_URL", "bogus://x", "worker", "--queues", "compress", process=True),
        setting("RECAP_BROKER_URL", "bogus://x", "worker", process=True),
        setting("RECAP_BROKER_URL", "redis", "compress", "c", "--enqueue", process=True),
        setting("RECAP_BROKER_URL", "", "compress", "c", "--enqueue", process=True),
        setting("RECAP_BROKER_URL", "redis://a;nope://b", "reconcile", process=True),
        setting("RECAP_BROKER_URL", "bogus://x", "serve", process=True),
        *(
            setting("RECAP_RESULT_BACKEND", value, *args, process=True)
            for value, args in [
                ("bogus://x", ("worker",)),
                ("bogus://x", ("worker", "--queues", "compress")),
                ("bogus://x", ("compress", "c", "--enqueue")),
                ("bogus://x", ("serve",)),
                ("bogus://x", ("reconcile",)),
                ("bogus://x", ("retry", "c")),
                ("redis", ("compress", "c", "--enqueue")),
                ("REDIS://h:6379/1", ("worker",)),
                ("://h", ("serve",)),
            ]
        ),
        setting("RECAP_UPSTREAM_API_BASE", "localhost:8000", "serve", process=True),
        setting("RECAP_SUMMARY_API_BASE", "localhost:11434", "compress", "c", "--force"),
    ]


def _assemble_rows() -> list[Row]:
    """An assemble that fails records no request profile (the seed recorded one already)."""
    return [
        Row(
            "assemble-window-below-last-turn",
            ("assemble", "c", "--max-input-tokens", "50"),
            "budget",
        ),
        Row(
            "assemble-new-parts-do-not-fit",
            ("assemble", "c", "--max-input-tokens", "400", "--system", "Be brief. " * 400),
            "budget",
        ),
        Row(
            "assemble-new-window-below-last-turn",
            ("assemble", "c", "--max-input-tokens", "60", "--system", "Other."),
            "budget",
        ),
    ]


def _message_rows() -> list[Row]:
    """Messages no provider accepts, through ``add`` and ``import``: refused, nothing stored."""
    add = ("add", "c", "--role")
    fields = (*add, "user", "--fields")
    imports = [
        ("id_true", "'id' must be a string"),
        ("id_number", "'id' must be a string"),
        ("id_float", "'id' must be a string"),
        ("message_id_true", "id must be a string"),
        ("message_id_list", "id must be a string"),
        ("user_null", "content"),
        ("user_missing", "content"),
        ("system_null", "content"),
        ("assistant_null", "content"),
        ("assistant_empty_calls", "content"),
        ("tool_null", "content"),
        ("parts_numbers", "part 0"),
        ("part_unknown", "zzz"),
        ("part_no_type", "type"),
        ("part_text_missing", "text"),
        ("part_text_number", "text"),
        ("content_object", "content"),
        ("good_then_unknown_part", "zzz"),
    ]
    return [
        Row("add-user-no-content", (*add, "user"), "content"),
        Row("add-system-no-content", (*add, "system"), "content"),
        Row("add-assistant-no-content", (*add, "assistant"), "content"),
        Row("add-tool-no-content", (*add, "tool", "--tool-call-id", "call_1"), "content"),
        Row("add-parts-numbers", (*fields, '{"content": [1, 2]}'), "part 0"),
        Row("add-part-unknown", (*fields, '{"content": [{"type": "zzz"}]}'), "zzz"),
        Row("add-part-not-object", (*fields, '{"content": ["x"]}'), "part 0"),
        Row("add-part-text-missing", (*fields, '{"content": [{"type": "text"}]}'), "text"),
        Row("add-content-number", (*fields, '{"content": 5}'), "content"),
        Row("add-content-object", (*fields, '{"content": {"weird": 1}}'), "content"),
        Row("add-content-true", (*fields, '{"content": true}'), "content"),
        Row("add-id-true", (*add, "user", "--content", "x", "--fields", '{"id": true}'), "id"),
        Row("add-id-object", (*add, "user", "--content", "x", "--fields", '{"id": {}}'), "id"),
        Row(
            "add-assistant-empty-calls",
            (*add, "assistant", "--tool-calls", "[]"),
            "content",
        ),
        Row("add-number-nan", (*add, "user", "--content", "x", "--fields", '{"t": NaN}'), "NaN"),
        *(Row(f"import-{key}", ("import", f"{{{key}}}"), fragment) for key, fragment in imports),
        Row("import-number-huge", ("import", "{big_number}"), "finite"),
    ]


def _pin_rows() -> list[Row]:
    """A pin of a message the conversation does not hold, or past the cap: nothing pinned (an id
    that is not one is a usage error, exit 2: ``tests/test_pins.py``)."""
    cap = {"RECAP_MAX_PINNED_TOKENS": "1"}
    return [
        Row("pin-unknown-conversation", ("pin", "nope", "1"), "unknown conversation 'nope'"),
        Row("pin-unknown-message", ("pin", "c", "999999"), "is not in conversation 'c'"),
        Row("unpin-unknown-message", ("pin", "c", "999999", "--off"), "is not in conversation"),
        Row("pin-over-the-cap", ("pin", "c", "1"), "RECAP_MAX_PINNED_TOKENS", cap),
        Row(
            "pin-cap-negative",
            ("pin", "c", "1"),
            "RECAP_MAX_PINNED_TOKENS",
            {"RECAP_MAX_PINNED_TOKENS": "-1"},
        ),
    ]


ROWS = [*_file_rows(), *_setting_rows(), *_assemble_rows(), *_message_rows(), *_pin_rows()]


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sqlite_url: str) -> Any:
    """Conversation ``c`` with one saved tool output and a recorded request profile, and the
    input files the rows name."""
    migrated(sqlite_url, monkeypatch).dispose()  # the schema `recap init` makes, from the template
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    paths = _inputs(inputs)
    seed = inputs / "seed.jsonl"
    seed.write_text(_line(SEED))
    assert recap("import", str(seed)).code == 0, "the seed import failed"
    assert recap("assemble", "c", "--system", "Be brief.").code == 0, "the seed assemble failed"
    assert list((tmp_path / "outputs").rglob("*.txt")), "the seed wrote no tool output"
    return make_engine(sqlite_url), paths


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_hostile_input_is_one_line_and_changes_nothing(
    row: Row, seeded: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A non-zero exit, exactly one stderr line naming the problem, no traceback, and the same
    rows and files afterwards."""
    engine, paths = seeded
    before = snapshot(engine, tmp_path)
    result = run_with_paths(row.args, row.env, paths, monkeypatch, process=row.process)
    assert_refused(result, FAILED, row.fragment)
    get_settings.cache_clear()
    assert snapshot(engine, tmp_path) == before


@pytest.mark.parametrize(
    ("host", "fragment"),
    [
        ("127.0.0.1", "address already in use"),
        ("no.such.host.invalid", "cannot listen on no.such.host.invalid"),
        ("192.0.2.1", "cannot listen on 192.0.2.1"),  # TEST-NET-1: on no machine
    ],
)
def test_serve_where_it_cannot_listen_is_one_line(
    host: str, fragment: str, seeded: Any, tmp_path: Path
) -> None:
    """``recap serve`` on a port that is taken or an address that is not this machine's: one
    line naming the address and a non-zero exit, before it creates anything or says it started
    (uvicorn logged the failure after the started line, and exited 3)."""
    import socket

    engine, _paths = seeded
    before = snapshot(engine, tmp_path)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = str(taken.getsockname()[1])
    try:
        env = {**os.environ, "RECAP_SERVE_KEYS": "client-key-1"}
        result = recap_process("serve", "--host", host, "--port", port, env=env, timeout=90)
    finally:
        taken.close()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.code == FAILED, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("recap: error: "), result.stderr[-2000:]
    assert fragment in lines[0], lines[0]
    assert snapshot(engine, tmp_path) == before
