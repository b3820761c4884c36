"""Fields Recap derives itself are never taken from input, and ``export --full`` opens only the
files Recap saved.

Hostile ``_``-keys through ``recap add``, ``recap import`` and the library are one clear error
that names the key, with nothing written. Stored rows whose saved-output path was tampered with
(written straight into the database, as an old or edited row would be) never make
``export --full`` open a device, a FIFO, a link or an oversized file: it keeps the stored
preview, and a cleared result's placeholder reads the same whether the named path exists or not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from recap.core import service
from recap.core.client import Recap
from recap.core.decision.toolresults import IDLE
from recap.core.errors import InputError
from recap.core.settings import Settings
from recap.core.storage.db import session_scope
from recap.core.storage.outputs import output_exists, read_output, save_output
from recap.core.storage.sweep import apply_clearings
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from tests.support.cli_helpers import assert_one_line_error, recap, recap_process

EXPORT_SECONDS = 60  # a FIFO or /dev/zero that were opened would hang or fill memory instead
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
BIG_OUTPUT = "".join(f"[{i:04d}] compiling module_{i}.c: warning: unused variable\n"
                     for i in range(3_000))  # fmt: skip


def record(output: str = "small", cid: str = "c") -> dict[str, Any]:
    return {
        "id": cid,
        "messages": [
            {"role": "user", "content": "Build it."},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": output, "tool_call_id": "call_1", "name": "bash"},
        ],
    }


def write_file(folder: Path, *records: dict[str, Any]) -> Path:
    path = folder / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as connection:
        return (
            int(connection.execute(text("SELECT count(*) FROM conversations")).scalar_one()),
            int(connection.execute(text("SELECT count(*) FROM messages")).scalar_one()),
        )


def saved_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


HOSTILE = [
    ({"_output_path": "/etc/passwd"}, "_output_path"),
    ({"_original_bytes": 10**12}, "_original_bytes"),
    ({"_output_path": "/dev/zero", "_original_bytes": 5}, "_output_path"),
    ({"_media": {"ref": "0" * 32}}, "_media"),
    ({"_anything": 1}, "_anything"),
    ({"_": None}, "'_'"),
]


@pytest.mark.parametrize(("fields", "key"), HOSTILE)
def test_recap_add_refuses_derived_fields(
    sqlite_engine: Engine, settings: Settings, tmp_path: Path, fields: dict[str, Any], key: str
) -> None:
    """`recap add --fields` with a `_`-key: one line naming it, nothing written."""
    service.import_conversations(sqlite_engine, [record()], settings)
    before = counts(sqlite_engine)
    result = recap("add", "c", "--role", "user", "--content", "hi", "--fields", json.dumps(fields))
    assert_one_line_error(result, key)
    assert counts(sqlite_engine) == before
    assert saved_files(tmp_path / "outputs") == []


@pytest.mark.parametrize(("fields", "key"), HOSTILE)
def test_recap_import_refuses_derived_fields(
    sqlite_engine: Engine, tmp_path: Path, fields: dict[str, Any], key: str
) -> None:
    """A `_`-key in any message of an import file: one line naming it, and nothing written,
    not even the saved output of a good record before it."""
    good = record(BIG_OUTPUT, "good")
    bad = record("fine", "bad")
    bad["messages"][2].update(fields)
    assert_one_line_error(recap("import", str(write_file(tmp_path, good, bad))), key)
    assert counts(sqlite_engine) == (0, 0)
    assert saved_files(tmp_path / "outputs") == []


def test_library_add_and_add_many_refuse_derived_fields(
    sqlite_engine: Engine, settings: Settings
) -> None:
    """Recap.add and Recap.add_many refuse them the same way."""
    service.import_conversations(sqlite_engine, [record()], settings)
    client = Recap(settings, sqlite_engine)
    before = counts(sqlite_engine)
    hostile = {"role": "user", "content": "hi", "_output_path": "/etc/passwd"}
    with pytest.raises(InputError, match="'_output_path'"):
        client.add("c", hostile)
    with pytest.raises(InputError, match="message 1: field '_original_bytes'"):
        client.add_many("c", [{"role": "user", "content": "a"},
                              {"role": "user", "content": "b", "_original_bytes": 3}])  # fmt: skip
    assert counts(sqlite_engine) == before


def test_plain_keys_named_like_columns_stay_plain_fields(
    sqlite_engine: Engine, settings: Settings
) -> None:
    """A key without the underscore is an ordinary extra field: stored and exported as given,
    never read as a column."""
    service.import_conversations(sqlite_engine, [record()], settings)
    message = {"role": "user", "content": "hi", "output_path": "/etc/passwd", "original_bytes": 9}
    mid = service.add_message(sqlite_engine, "c", message)
    with sqlite_engine.connect() as connection:
        row = connection.execute(
            text("SELECT output_path, original_bytes FROM messages WHERE id = :id"), {"id": mid}
        ).one()
    assert tuple(row) == (None, None)
    exported = recap("export", "c", "--full").json()["messages"][-1]
    assert exported["output_path"] == "/etc/passwd" and exported["content"] == "hi"


# --- export --full against tampered rows -------------------------------------------------------


@pytest.fixture
def stored(sqlite_engine: Engine, tmp_path: Path) -> dict[str, Any]:
    """A conversation whose tool output was cut on the way in: its row, file and preview."""
    assert recap("import", str(write_file(tmp_path, record(BIG_OUTPUT)))).code == 0
    with sqlite_engine.connect() as connection:
        mid, path, size = connection.execute(
            text("SELECT id, output_path, original_bytes FROM messages WHERE role = 'tool'")
        ).one()
    preview = recap("export", "c").json()["messages"][2]["content"]
    assert preview != BIG_OUTPUT and Path(path).is_file() and size == len(BIG_OUTPUT.encode())
    return {"id": mid, "path": Path(path), "size": size, "preview": preview, "tmp": tmp_path}


def tamper(engine: Engine, mid: int, path: str | Path, size: int | None) -> None:
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE messages SET output_path = :p, original_bytes = :s WHERE id = :id"),
            {"p": str(path), "s": size, "id": mid},
        )


def export_full_content(tmp_path: Path) -> str:
    """`recap export c --full` in a child process with a deadline, the tool result's content."""
    done = recap_process("export", "c", "--full", env=dict(os.environ), timeout=EXPORT_SECONDS)
    assert done.code == 0, done.stderr
    return str(json.loads(done.stdout)["messages"][2]["content"])


def _fifo_inside(stored: dict[str, Any]) -> tuple[Path, int]:
    """A FIFO at a path of Recap's own shape inside the output folder."""
    name = "ab" + "0" * 30
    folder = stored["path"].parent.parent / name[:2]
    folder.mkdir(exist_ok=True)
    fifo = folder / f"{name}.txt"
    os.mkfifo(fifo)
    return fifo, stored["size"]


def _fifo_outside(stored: dict[str, Any]) -> tuple[Path, int]:
    fifo = stored["tmp"] / "outside.fifo"
    os.mkfifo(fifo)
    return fifo, stored["size"]


def _link_out_of_the_folder(stored: dict[str, Any]) -> tuple[Path, int]:
    """The saved file moved out of the folder, a link of the same name left in its place: the
    content still matches the name, but the link is not followed."""
    real: Path = stored["path"]
    outside = stored["tmp"] / "moved.txt"
    real.rename(outside)
    real.symlink_to(outside)
    return real, stored["size"]


def _folder_link_out(stored: dict[str, Any]) -> tuple[Path, int]:
    """The two-letter subfolder replaced by a link to a folder outside holding the same file."""
    real: Path = stored["path"]
    outside = stored["tmp"] / "elsewhere"
    real.parent.rename(outside)
    real.parent.symlink_to(outside, target_is_directory=True)
    return real, stored["size"]


def _larger_than_recorded(stored: dict[str, Any]) -> tuple[Path, int]:
    """The real file, but the row records fewer bytes than it holds."""
    return stored["path"], stored["size"] - 1


def _grown_file(stored: dict[str, Any]) -> tuple[Path, int]:
    """The saved file grown past what was recorded (content appended)."""
    with stored["path"].open("a") as handle:
        handle.write("x" * 1_000_000)
    return stored["path"], stored["size"]


def _outside_regular_file(stored: dict[str, Any]) -> tuple[Path, int]:
    """A regular file outside the folder holding the very text, at an arbitrary path."""
    outside = stored["tmp"] / "copy.txt"
    outside.write_text(BIG_OUTPUT)
    return outside, stored["size"]


def _relative_path(stored: dict[str, Any]) -> tuple[str, int]:
    """The saved file named by a path relative to the working folder."""
    return os.path.relpath(stored["path"]), stored["size"]


TAMPERED = {
    "/dev/zero": lambda s: (Path("/dev/zero"), s["size"]),
    "/dev/zero without a size": lambda s: (Path("/dev/zero"), None),
    "/etc/passwd": lambda s: (Path("/etc/passwd"), s["size"]),
    "a FIFO inside the folder": _fifo_inside,
    "a FIFO outside": _fifo_outside,
    "a link out of the folder": _link_out_of_the_folder,
    "a subfolder linked out": _folder_link_out,
    "a file larger than recorded": _larger_than_recorded,
    "a file grown after it was saved": _grown_file,
    "a regular file outside the folder": _outside_regular_file,
    "a relative path into the folder": _relative_path,
}


@pytest.mark.timeout(EXPORT_SECONDS * 2)
@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_export_full_never_opens_a_tampered_path(
    sqlite_engine: Engine, stored: dict[str, Any], case: str
) -> None:
    """export --full keeps the stored preview for every path Recap did not build (or whose file
    is not the regular file of the recorded size), and finishes."""
    path, size = TAMPERED[case](stored)
    tamper(sqlite_engine, stored["id"], path, size)
    assert export_full_content(stored["tmp"]) == stored["preview"]


def test_export_full_restores_an_untouched_row(stored: dict[str, Any]) -> None:
    """The control: the row as ingest wrote it is restored in full."""
    assert export_full_content(stored["tmp"]) == BIG_OUTPUT


def test_placeholder_does_not_reveal_whether_a_path_exists(
    sqlite_engine: Engine, settings: Settings, stored: dict[str, Any]
) -> None:
    """A cleared result whose row names an arbitrary path reads the same for a path that exists
    and one that does not: both are treated as gone."""
    with session_scope(sqlite_engine) as session:
        apply_clearings(
            session,
            "c",
            ClearingPlan(IDLE, (PlannedClearing(message_id=stored["id"], tokens_reclaimed=100),)),
        )
    rendered = {}
    for path in ("/etc/passwd", "/etc/no-such-file"):
        tamper(sqlite_engine, stored["id"], path, stored["size"])
        request = service.assemble(sqlite_engine, "c", settings, max_input_tokens=128_000)
        rendered[path] = request.messages[2]["content"].replace(path, "PATH")
    assert rendered["/etc/passwd"] == rendered["/etc/no-such-file"]
    assert "expired" in rendered["/etc/passwd"]


def test_output_exists_and_read_output_look_only_inside_the_folder(tmp_path: Path) -> None:
    """Only a path of Recap's shape under the output folder is looked at."""
    root = tmp_path / "outputs"
    saved = save_output(root, "hello " * 100)
    assert output_exists(str(saved), root) and read_output(str(saved), root=root) is not None
    for other in ("/etc/passwd", "/dev/zero", str(tmp_path), "", None):
        assert not output_exists(other, root)
        assert read_output(other, root=root) is None
    elsewhere = tmp_path / "other"
    assert not output_exists(str(saved), elsewhere)
    assert read_output(str(saved), root=root, size=len("hello " * 100) + 1) is None
