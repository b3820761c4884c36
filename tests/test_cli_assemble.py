"""`recap assemble` end to end on SQLite: the contract's JSON, branches, options, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from recap.core.request.refs import summary_note
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from tests.support.cli_helpers import assert_one_line_error, recap, recap_process

CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"c":"ls"}'}}
CONVERSATION = {
    "id": "c",
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "call_1", "name": "bash"},
        {"role": "assistant", "content": "Two files: a.py and b.py."},
        {"role": "user", "content": "Thanks. Now read a.py."},
    ],
}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
CONTRACT_KEYS = {"messages", "tokens", "budget", "summary_id", "dropped_message_ids"}
TOKEN_KEYS = {"system", "summary", "history", "tools", "reminder", "total"}


@pytest.fixture
def imported(sqlite_engine: Engine, tmp_path: Path) -> Engine:
    """The small conversation ``c`` imported, with a tools file beside it."""
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(CONVERSATION) + "\n")
    assert recap("import", str(path), "--json").code == 0
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    return sqlite_engine


def _rows(engine: Engine) -> tuple[int, ...]:
    with engine.connect() as connection:
        return tuple(
            int(connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
            for table in ("conversations", "messages", "summaries", "clearings", "usage")
        )


def test_contract_json(imported: Engine) -> None:
    """The JSON holds the contract's keys; the request is system, history, reminder last."""
    payload = recap(
        "assemble", "c", "--system", "Be brief.", "--reminder", "Stay on task.",
        "--tools", "tools.json", "--max-input-tokens", "4000", "--json",
    ).json()  # fmt: skip
    assert set(payload) >= CONTRACT_KEYS
    assert set(payload["tokens"]) >= TOKEN_KEYS
    assert payload["budget"] == 3800 and payload["summary_id"] is None
    assert payload["dropped_message_ids"] == []
    roles = [m["role"] for m in payload["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "user"]
    assert payload["messages"][0]["content"] == "Be brief."
    assert payload["messages"][-1] == {"role": "user", "content": "Stay on task."}
    assert payload["tokens"]["tools"] > 0 and payload["tokens"]["total"] <= payload["budget"]


def test_stored_system_prompt_and_summary(imported: Engine) -> None:
    """Without --system the stored prompt leads; a stored summary follows it."""
    with imported.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO summaries (conversation_id, cutoff_message_id, text, tokens, "
                "encoding, model, input_tokens, output_tokens, identifier_retention, created_at) "
                "VALUES ('c', 4, 'Listed the files.', 5, 'o200k_base', 'm', 0, 0, 1.0, "
                "'2026-01-01 00:00:00')"
            )
        )
    payload = recap("assemble", "c", "--max-input-tokens", "4000", "--json").json()
    contents = [m["content"] for m in payload["messages"]]
    assert contents[0] == "You are a coding agent."
    assert contents[1] == SUMMARY_MESSAGE_PREFIX + "Listed the files." + summary_note(4)
    assert contents[2:] == ["Two files: a.py and b.py.", "Thanks. Now read a.py."]
    assert payload["summary_id"] == 1


def test_leaf_selects_the_branch(imported: Engine) -> None:
    """--leaf assembles another branch: an edit of the last user message."""
    edit = recap("add", "c", "--role", "user", "--content", "Read b.py.", "--parent", "5", "--json")
    leaf = edit.json()["message_id"]
    payload = recap("assemble", "c", "--leaf", str(leaf), "--json").json()
    assert payload["messages"][-1]["content"] == "Read b.py."
    earlier = recap("assemble", "c", "--leaf", "6", "--json").json()
    assert earlier["messages"][-1]["content"] == "Thanks. Now read a.py."


def test_context_files_and_forgotten(imported: Engine, tmp_path: Path) -> None:
    """Context files go just before the last user message; one too big is listed as forgotten."""
    (tmp_path / "AGENTS.md").write_text("Run pytest before you finish.")
    (tmp_path / "big.txt").write_text("word " * 5_000)
    payload = recap(
        "assemble", "c", "--context-file", "AGENTS.md", "--context-file", "big.txt",
        "--max-input-tokens", "1500", "--json",
    ).json()  # fmt: skip
    contents = [str(m["content"]) for m in payload["messages"]]
    assert contents[-3].startswith("[Context file: AGENTS.md]")
    assert "big.txt" in contents[-2] and contents[-1] == "Thanks. Now read a.py."
    assert payload["forgotten_files"] == ["big.txt"]


def test_text_only_and_cache(imported: Engine) -> None:
    """--text-only leaves no tool roles; --cache marks the system prompt."""
    payload = recap("assemble", "c", "--text-only", "--cache", "--json").json()
    assert all(m["role"] != "tool" and "tool_calls" not in m for m in payload["messages"])
    assert payload["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_human_output(imported: Engine) -> None:
    """Without --json the request is shown as a table with its token line."""
    result = recap("assemble", "c")
    assert result.code == 0 and "request for c" in result.stdout and "budget" in result.stdout


def test_console_script_gives_the_same_bytes(imported: Engine, sqlite_url: str) -> None:
    """Another process assembling the same state prints byte-identical JSON."""
    args = ("assemble", "c", "--reminder", "r", "--tools", "tools.json", "--json")
    here = recap(*args)
    env = {**os.environ, "RECAP_DATABASE_URL": sqlite_url}
    there = recap_process(*args, env=env)
    assert there.code == 0, there.stderr
    assert there.stdout == here.stdout


BAD: list[tuple[list[str], str]] = [
    (["assemble", "nope"], "unknown conversation"),
    (["assemble", "c", "--leaf", "999"], "999"),
    (["assemble", "c", "--tools", "broken.json"], "malformed JSON"),
    (["assemble", "c", "--tools", "object.json"], "list of tool schemas"),
    (["assemble", "c", "--tools", "missing.json"], "cannot read"),
    (["assemble", "c", "--context-file", "missing.md"], "cannot read"),
    (["assemble", "c", "--max-input-tokens", "20"], "last user message"),
    (["assemble", "c", "--max-input-tokens", "0"], "--max-input-tokens"),
    (["assemble", "c", "--model", "no-such-model"], "unknown model"),
]


@pytest.mark.parametrize(("args", "fragment"), BAD)
def test_bad_input_is_one_line(
    imported: Engine, tmp_path: Path, args: list[str], fragment: str
) -> None:
    """Each kind of bad input: non-zero exit, one line on stderr, nothing written."""
    (tmp_path / "broken.json").write_text("[{")
    (tmp_path / "object.json").write_text(json.dumps({"tools": {"name": "x"}}))
    before = _rows(imported)
    assert_one_line_error(recap(*args), fragment)
    assert _rows(imported) == before


def test_before_init_says_so(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Assembling from an empty database asks for `recap init`."""
    monkeypatch.setenv("RECAP_DATABASE_URL", sqlite_url)
    assert_one_line_error(recap("assemble", "c"), "recap init")


def test_init_reports_the_configured_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recap init --json` names the database as configured (the password hidden), not the
    read-only form other commands open it with."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    monkeypatch.setenv("RECAP_DATABASE_URL", url)
    done = recap("init", "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) == {
        "database": url,
        "revision": json.loads(done.stdout)["revision"],
    }
    assert (tmp_path / "fresh.db").exists()
