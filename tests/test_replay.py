"""`recap replay` on real logs: every request within the window, the contract's figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli_helpers import assert_one_line_error, recap
from tests.support.data import DATA_DIR

TOTAL_KEYS = {
    "peak_tokens",
    "overflows_without",
    "summaries",
    "summarizer_tokens",
    "cost_vs_no_clearing",
    "cost_vs_sliding",
}


def test_openhands_at_16k_never_overflows() -> None:
    """At a 16,000-token window no replayed request exceeds it, though many would without Recap."""
    report = recap(
        "replay", str(DATA_DIR / "openhands.jsonl"), "--window", "16000", "--json"
    ).json()
    total = report["total"]
    assert set(total) >= TOTAL_KEYS
    assert len(report["conversations"]) == 9
    for conversation in report["conversations"]:
        assert conversation["over_window"] == 0, conversation
        assert conversation["errors"] == [], conversation
        assert conversation["peak_tokens"] <= 16_000
    assert total["peak_tokens"] <= 16_000
    assert total["overflows_without"] > 0
    assert total["summaries"] >= 1
    assert 0 < total["cost_vs_no_clearing"] < 1
    assert 0 < total["cost_vs_sliding"] < 1


def test_idle_gap_clears_what_the_cold_cache_allows() -> None:
    """With an idle gap, the sweep clears old results in the middle of each long run."""
    plain = recap("replay", str(DATA_DIR / "openhands.jsonl"), "--window", "16000", "--json")
    gapped = recap(
        "replay", str(DATA_DIR / "openhands.jsonl"), "--window", "16000", "--idle-gap", "--json"
    )
    assert gapped.json()["total"]["clearings"] > plain.json()["total"]["clearings"]
    assert gapped.json()["total"]["over_window"] == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--window", "0"], "--window"),
        (["--window", "-5"], "--window"),
    ],
)
def test_bad_window_is_one_line(args: list[str], fragment: str) -> None:
    """A window that is not positive is one clear error."""
    assert_one_line_error(recap("replay", str(DATA_DIR / "openhands.jsonl"), *args), fragment)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{oops\n", "malformed JSON"),
        (
            '{"messages": [{"role": "tool", "content": "x", "tool_call_id": "c1"}]}\n',
            "answers no earlier call",
        ),
    ],
)
def test_bad_file_is_one_line(tmp_path: Path, content: str, fragment: str) -> None:
    """A malformed or inconsistent file is one clear error."""
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert_one_line_error(recap("replay", str(path)), fragment)


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    """A file that cannot be read is one clear error."""
    assert_one_line_error(recap("replay", str(tmp_path / "nope.jsonl")), "cannot read")


def test_replay_reports_silent_truncations_with_the_host_s_tools(tmp_path: Path) -> None:
    """A record that brings its own tool schemas is replayed with them: the JSON reports the
    fixed parts and no silent truncation, per conversation and in total; the table shows it."""
    from tests.test_fidelity import WINDOW, agent_record

    path = tmp_path / "with-tools.jsonl"
    path.write_text(json.dumps(agent_record(24)) + "\n")
    report = recap("replay", str(path), "--window", str(WINDOW), "--json").json()
    (conversation,) = report["conversations"]
    assert conversation["tools_from_data"] and conversation["fixed_tokens"] >= 3_400
    assert conversation["silent_truncations"] == 0 and conversation["summaries"] >= 1
    assert report["total"]["silent_truncations"] == 0
    assert report["total"]["truncations"] == 0
    table = recap("replay", str(path), "--window", str(WINDOW))
    assert table.code == 0 and "silent" in table.stdout
