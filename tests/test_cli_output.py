"""What the CLI prints and builds: `recap export`'s ids taken back by `recap serve` (and by
`recap import`), `recap stats` readable at 80 columns, `recap timeline`'s totals in the
provider's tokens (as `recap stats` reports them), and `recap worker` letting the user's Celery
options replace its defaults."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from recap.core import service
from recap.core.settings import get_settings
from tests.support.cli_helpers import recap
from tests.support.llm_server import LLMServer
from tests.support.serving import KEY_A, MODEL, WINDOW, reply_to, running_serve
from recap.workers import runner

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "a.py b.py"},
    {"role": "assistant", "content": "a.py and b.py."},
    {"role": "user", "content": "And the tests?"},
]


def _imported(tmp_path: Path, cid: str = "c", window: int = WINDOW) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": cid, "messages": CHAT}) + "\n", encoding="utf-8")
    assert recap("import", str(path), "--max-input-tokens", str(window)).code == 0


# --- export ------------------------------------------------------------------------------------


def test_exported_ids_are_message_ids_that_import_takes_back(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    """Each exported message carries its message id (an integer, as `recap add` gives it), and
    the export imports again as it is."""
    _imported(tmp_path)
    exported = recap("export", "c").json()
    stored = service.export_conversation(sqlite_engine, "c")["messages"]
    assert [m["id"] for m in exported["messages"]] == [m["id"] for m in stored]
    assert all(type(m["id"]) is int for m in exported["messages"])
    exported["id"] = "again"
    (tmp_path / "again.jsonl").write_text(json.dumps(exported) + "\n", encoding="utf-8")
    assert recap("import", str(tmp_path / "again.jsonl")).code == 0
    again = recap("export", "again").json()["messages"]
    strip = [{k: v for k, v in m.items() if k != "id"} for m in again]
    assert strip == [{k: v for k, v in m.items() if k != "id"} for m in exported["messages"]]
    assert recap("pin", "c", str(exported["messages"][1]["id"])).code == 0  # the id a command takes


def test_an_export_sent_back_to_recap_serve_is_accepted(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    """The exported messages, ids and all, sent to `recap serve` as a chat request (an export
    replayed, say) are taken: 200, not "id must be a string"."""
    _imported(tmp_path)
    messages = recap("export", "c").json()["messages"]
    llm = LLMServer(default=reply_to).start()
    try:
        folder = tmp_path / "serve"
        folder.mkdir()
        with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm) as serve:
            answer = httpx.post(
                f"{serve.base_url}/chat/completions",
                json={"model": MODEL, "messages": messages},
                headers={"Authorization": f"Bearer {KEY_A}", "X-Recap-Conversation": "replayed"},
                timeout=60,
            )
    finally:
        llm.stop()
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]


# --- stats at 80 columns -----------------------------------------------------------------------


@pytest.mark.parametrize("cid", ["c", "a-conversation-id-" + "x" * 90])
def test_stats_fit_80_columns(
    sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cid: str
) -> None:
    """At COLUMNS=80 every line of `recap stats` fits, and each figure of `--json` is shown
    whole (no value cut to an ellipsis)."""
    monkeypatch.setenv("COLUMNS", "80")
    _imported(tmp_path, cid)
    human = recap("stats", cid)
    assert human.code == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, human.stdout
    assert "…" not in human.stdout
    figures = recap("stats", cid, "--json").json()
    for name, value in figures.items():
        row = next(line for line in lines if f" {name} " in line)
        shown = f"{value:,}" if type(value) is int else str(value).lower()
        assert shown in row or str(value) in human.stdout, (name, row)


# --- the timeline's totals -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_the_timeline_budget_is_in_the_windows_terms(
    sqlite_engine: Engine, tmp_path: Path, seed: int
) -> None:
    """After a provider reading below Recap's count (calibration under 1), `recap timeline`'s
    budget stays within the window, in provider tokens: Recap's estimate scaled by the same
    calibration `recap stats` reports, and its request the size `recap stats` says is used."""
    rng = random.Random(seed)
    window = rng.choice([4_000, 8_000, 16_000])
    _imported(tmp_path, window=window)
    estimated = recap("assemble", "c", "--json").json()["tokens"]["total"]
    measured = max(int(estimated * rng.uniform(0.55, 0.95)), 1)
    assert recap("usage", "c", "--prompt-tokens", str(measured)).code == 0
    stats = recap("stats", "c", "--json").json()
    line = recap("timeline", "c", "--json").json()
    assert stats["calibration"] < 1 and line["calibration"] == stats["calibration"]
    assert line["window"] == stats["window"] == window
    assert line["budget"] <= window, line
    assert line["budget"] <= stats["available"] + stats["fixed"]
    factor = line["calibration"]
    assert abs(line["budget"] - line["estimated"]["budget"] * factor) <= 2
    assert line["estimated"]["budget"] > line["budget"]
    assert abs(line["request_tokens"] - stats["used"]) <= 1, (line["request_tokens"], stats)
    human = recap("timeline", "c").stdout
    assert f"of a budget of {line['budget']:,}, window {window:,} (provider tokens)" in human


# --- recap worker's Celery options ---------------------------------------------------------------


def _plans(monkeypatch: pytest.MonkeyPatch, *args: str) -> dict[str, list[str]]:
    """The children's command lines `recap worker ARGS` would start (the supervisor is not
    started: its plan is kept)."""
    kept: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "become_supervisor", kept.append)
    monkeypatch.setenv("RECAP_BROKER_URL", "filesystem://")
    get_settings.cache_clear()
    result = recap("worker", *args)
    assert kept, result.stderr
    return {
        name: command[command.index("worker") :] for name, command in kept[0]["commands"].items()
    }


@pytest.mark.parametrize(
    ("given", "option", "value"),
    [
        (["--concurrency", "2"], "--concurrency", "2"),
        (["--concurrency=2"], "--concurrency", "2"),
        (["-c", "2"], "--concurrency", "2"),
        (["-c2"], "--concurrency", "2"),
        (["--pool", "prefork"], "--pool", "prefork"),
        (["-P", "solo"], "--pool", "solo"),
        (["--loglevel", "DEBUG"], "--loglevel", "DEBUG"),
        (["-l", "debug"], "--loglevel", "debug"),
        (["--hostname", "mine@%h"], "--hostname", "mine@%h"),
        (["-n", "mine@%h"], "--hostname", "mine@%h"),
    ],
)
def test_worker_options_replace_the_defaults(
    monkeypatch: pytest.MonkeyPatch, given: list[str], option: str, value: str
) -> None:
    """`recap worker --concurrency 2` (in any spelling) gives each child one concurrency, the
    user's: the default is dropped, not followed by the user's."""
    short = {"--concurrency": "-c", "--pool": "-P", "--loglevel": "-l", "--hostname": "-n"}
    spellings = {option, short[option]}
    for queues in ("compress,maintenance", "compress", "maintenance"):
        for name, argv in _plans(monkeypatch, "--queues", queues, *given).items():
            named = [a for a in argv if a.split("=")[0] in spellings or a[:2] in spellings]
            assert len(named) == 1, (name, argv)
            assert argv[-len(given) :] == given, argv
    defaults = _plans(monkeypatch)
    assert defaults["compress"].count("--concurrency") == 1
    assert defaults["compress"][defaults["compress"].index("--concurrency") + 1] == "16"
    assert defaults["maintenance"][defaults["maintenance"].index("--pool") + 1] == "threads"
