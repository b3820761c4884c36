"""Saved tool outputs: truncation on import and add, export --full, unwritable folders, cleanup."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from structlog.testing import capture_logs

from recap.core.counting import tokens
from recap.core.decision.toolresults import IDLE
from recap.core.settings import get_settings
from recap.core.storage.db import session_scope
from recap.core.storage.outputs import Ingest, cleanup_outputs, read_output, save_output
from recap.core.storage.sweep import apply_clearings
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from tests.support.cli_helpers import assert_one_line_error, recap

DAY = 86_400
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "bash", "arguments": '{"c":"make"}'},
}


def build_log(lines: int = 2_000) -> str:
    """About 320 KB of compiler output."""
    return "".join(
        f"[{i:04d}] gcc -O2 -c src/module_{i}.c -o build/module_{i}.o: warning: unused variable "
        f"'tmp_{i}' [-Wunused-variable] in function handler_{i}; see include/module_{i}.h:{i}\n"
        for i in range(lines)
    )


def conversation(output: str, cid: str = "big") -> dict[str, Any]:
    return {
        "id": cid,
        "messages": [
            {"role": "user", "content": "Build it."},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": output, "tool_call_id": "call_1", "name": "bash"},
            {"role": "assistant", "content": "The build finished."},
            {"role": "user", "content": "Good, what failed?"},
        ],
    }


def import_file(tmp_path: Path, *records: dict[str, Any]) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_300_kb_output_is_a_preview_plus_a_file(sqlite_engine: Engine, tmp_path: Path) -> None:
    """A 300 KB output is stored as a preview and a file, the request stays small, and export
    --full gives the original text back."""
    output = build_log()
    assert len(output.encode()) > 300_000
    assert recap("import", str(import_file(tmp_path, conversation(output))), "--json").code == 0

    saved = files_under(tmp_path / "outputs")
    assert len(saved) == 1
    assert saved[0].read_text() == output
    stored = recap("export", "big").json()["messages"][2]
    assert stored["content"] != output and str(saved[0]) in stored["content"]
    assert set(stored) == {"id", "role", "content", "tool_call_id", "name"}  # nothing internal

    request = recap("assemble", "big", "--max-input-tokens", "128000", "--json").json()
    full_tokens = tokens.count_text(output, tokens.encoding_name_for("gpt-4o-mini"))
    assert request["tokens"]["total"] < 4_000 < full_tokens / 10

    restored = recap("export", "big", "--full").json()["messages"]
    assert restored[2]["content"] == output
    assert [m["content"] for m in restored[:2]] == [None if i else "Build it." for i in range(2)]


def test_files_are_private_and_named_by_content(tmp_path: Path) -> None:
    """Saved files are 0600 in 0700 folders, named by their content (stored once)."""
    root = tmp_path / "outputs"
    first = save_output(root, "hello " * 10_000)
    again = save_output(root, "hello " * 10_000)
    other = save_output(root, "other " * 10_000)
    assert first == again != other
    assert first.is_absolute() and first.parent.parent == root
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert read_output(str(first)) == "hello " * 10_000


def test_read_output_refuses_a_changed_file(tmp_path: Path) -> None:
    """A saved file whose content no longer matches its name is not given back."""
    path = save_output(tmp_path / "outputs", "original " * 1_000)
    path.write_text("tampered")
    assert read_output(str(path)) is None
    assert read_output(str(tmp_path / "missing.txt")) is None


def test_add_truncates_a_content_file_too(sqlite_engine: Engine, tmp_path: Path) -> None:
    """`recap add --content-file` goes through the same truncation as import."""
    record = conversation("ok")
    record["messages"] = record["messages"][:2]
    assert recap("import", str(import_file(tmp_path, record)), "--json").code == 0
    big = tmp_path / "out.txt"
    big.write_text(build_log())
    added = recap(
        "add", "big", "--role", "tool", "--content-file", str(big),
        "--tool-call-id", "call_1", "--name", "bash", "--json",
    ).json()  # fmt: skip
    exported = recap("export", "big", "--full").json()["messages"]
    assert exported[-1]["id"] == added["message_id"]
    assert exported[-1]["content"] == big.read_text()
    assert len(recap("export", "big").json()["messages"][-1]["content"]) < 12_000


def test_json_search_result_keeps_its_structure_on_import(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    """A large JSON search result is stored as the same JSON cut down to ids, titles and URLs."""
    hits = [
        {"id": i, "title": f"Doc {i}", "url": f"https://docs.example/{i}", "score": 1 / (i + 1),
         "snippet": "lorem ipsum " * 100, "body": "x" * 5_000}
        for i in range(100)
    ]  # fmt: skip
    output = json.dumps({"query": "celery retries", "results": hits})
    assert recap("import", str(import_file(tmp_path, conversation(output))), "--json").code == 0
    stored = recap("export", "big").json()["messages"][2]["content"]
    note, _, body = stored.partition("\n")
    preview = json.loads(body)
    assert preview["query"] == "celery retries"
    assert [h["url"] for h in preview["results"]] == [
        f"https://docs.example/{i}" for i in range(len(preview["results"]))
    ]
    assert "of 100 results" in note
    assert recap("export", "big", "--full").json()["messages"][2]["content"] == output


def test_unwritable_output_folder_keeps_the_message_whole(
    sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the output folder cannot be written, the message is stored in full and an error is
    logged: nothing is lost silently."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the output folder should be")
    monkeypatch.setenv("RECAP_OUTPUT_DIR", str(blocker / "outputs"))
    output = build_log()
    with capture_logs() as logs:
        result = recap("import", str(import_file(tmp_path, conversation(output))), "--json")
    assert result.code == 0, result.stderr
    assert recap("export", "big").json()["messages"][2]["content"] == output
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == ["tool_output_not_saved"]
    assert errors[0]["tool_call_id"] == "call_1"


def test_oversized_write_file_arguments_are_trimmed_and_restored(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    """A write_file call carrying a whole file is stored trimmed; export --full restores it."""
    content = "def f():\n    return 1\n" * 2_000
    arguments = json.dumps({"path": "src/big.py", "content": content})
    call = {
        "id": "w1",
        "type": "function",
        "function": {"name": "write_file", "arguments": arguments},
    }
    record = {
        "id": "w",
        "messages": [
            {"role": "user", "content": "Write it."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "written", "tool_call_id": "w1", "name": "write_file"},
        ],
    }
    assert recap("import", str(import_file(tmp_path, record)), "--json").code == 0
    stored = recap("export", "w").json()["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert len(stored) < 2_500
    assert json.loads(stored)["path"] == "src/big.py"
    full = recap("export", "w", "--full").json()["messages"][1]["tool_calls"][0]
    assert full == call


def test_small_messages_pass_through_unchanged(tmp_path: Path) -> None:
    """Ingest leaves a message within the limits exactly as it was, and writes nothing."""
    ingest = Ingest.from_settings(get_settings())
    message = {"role": "tool", "content": "short", "tool_call_id": "x"}
    assert ingest(message) is message
    assert not (tmp_path / "outputs").exists()


def test_cleared_result_with_an_expired_file_still_assembles(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    """A cleared result whose saved file was cleaned up renders a placeholder saying it expired."""
    first, second = conversation(build_log(), "a"), conversation("small", "a")
    record = {"id": "a", "messages": [*first["messages"], *second["messages"][1:]]}
    record["messages"][5]["tool_calls"] = [{**CALL, "id": "call_2"}]
    record["messages"][6]["tool_call_id"] = "call_2"
    assert recap("import", str(import_file(tmp_path, record)), "--json").code == 0
    with session_scope(sqlite_engine) as session:
        apply_clearings(
            session, "a", ClearingPlan(IDLE, (PlannedClearing(message_id=3, tokens_reclaimed=100),))
        )
    saved = files_under(tmp_path / "outputs")
    size = saved[0].stat().st_size
    before = recap("assemble", "a", "--max-input-tokens", "128000", "--json").json()
    assert str(saved[0]) in before["messages"][2]["content"]
    cleaned = recap("cleanup", "--retention-days", "0", "--json").json()
    assert cleaned == {"deleted": 1, "bytes": size}
    after = recap("assemble", "a", "--max-input-tokens", "128000", "--json").json()
    assert "expired" in after["messages"][2]["content"]
    assert recap("export", "a", "--full").json()["messages"][2]["content"].startswith("[Output")


# --- cleanup -----------------------------------------------------------------------------------


def aged(path: Path, days: float) -> Path:
    moment = time.time() - days * DAY
    os.utime(path, (moment, moment), follow_symlinks=False)
    return path


@pytest.fixture
def outputs(tmp_path: Path) -> dict[str, Path]:
    """An output folder with an expired file, a fresh one, and links to an old file outside."""
    root = tmp_path / "outputs"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    victim = outside / "precious.txt"
    victim.write_text("must survive")
    aged(victim, 30)
    (outside / "sub").mkdir()
    aged_in_sub = outside / "sub" / "also-old.txt"
    aged_in_sub.write_text("must survive too")
    aged(aged_in_sub, 30)
    old = aged(save_output(root, "old output " * 500), 8)
    fresh = save_output(root, "fresh output " * 500)
    link = root / "ab" / "link.txt"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(victim)
    aged(link, 30)
    folder_link = root / "cd"
    folder_link.symlink_to(outside / "sub", target_is_directory=True)
    return {"root": root, "old": old, "fresh": fresh, "victim": victim, "link": link,
            "sub": aged_in_sub}  # fmt: skip


def test_cleanup_removes_only_expired_files(outputs: dict[str, Path]) -> None:
    """Only regular files past the retention go; links and what they point to stay."""
    size = outputs["old"].stat().st_size
    result = cleanup_outputs(outputs["root"], now=time.time(), retention_days=7)
    assert result.as_dict() == {"deleted": 1, "bytes": size}
    assert not outputs["old"].exists()
    assert outputs["fresh"].exists()
    assert outputs["victim"].read_text() == "must survive"
    assert outputs["sub"].read_text() == "must survive too"
    assert outputs["link"].is_symlink()


def test_cleanup_twice_is_safe(outputs: dict[str, Path]) -> None:
    """A second cleanup finds nothing left to delete."""
    assert cleanup_outputs(outputs["root"], now=time.time(), retention_days=7).deleted == 1
    assert cleanup_outputs(outputs["root"], now=time.time(), retention_days=7).deleted == 0


def test_concurrent_cleanups_delete_each_file_once(tmp_path: Path) -> None:
    """Cleanups running at the same time delete every expired file exactly once between them."""
    root = tmp_path / "outputs"
    expired = [aged(save_output(root, f"output {i} " * 200), 10) for i in range(300)]
    results: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(cleanup_outputs(root, now=time.time(), retention_days=7).deleted)
        except BaseException as exc:  # a failure in a thread must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(results) == len(expired)
    assert not any(path.exists() for path in expired)


def test_cleanup_of_a_missing_folder_is_a_no_op(tmp_path: Path) -> None:
    """No output folder yet: nothing to delete, no error."""
    assert cleanup_outputs(tmp_path / "none", now=time.time(), retention_days=7).deleted == 0


def test_cli_cleanup_json_and_bad_input(sqlite_engine: Engine, tmp_path: Path) -> None:
    """`recap cleanup --json` prints the contract's object; a negative retention is one error."""
    root = tmp_path / "outputs"
    old = aged(save_output(root, "old " * 100), 9)
    assert recap("cleanup", "--retention-days", "-1").code != 0
    assert old.exists()
    assert_one_line_error(recap("cleanup", "--retention-days", "-1"), "retention")
    assert recap("cleanup", "--json").json() == {"deleted": 1, "bytes": 400}


def test_bad_import_writes_nothing(sqlite_engine: Engine, tmp_path: Path) -> None:
    """A file that fails validation stores no row and saves no output."""
    bad = conversation(build_log())
    bad["messages"][2]["tool_call_id"] = "nobody"
    result = recap("import", str(import_file(tmp_path, bad)), "--json")
    assert_one_line_error(result, "answers no")
    with sqlite_engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM messages")).scalar_one() == 0
    assert not (tmp_path / "outputs").exists()
