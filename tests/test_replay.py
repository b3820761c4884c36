"""`recap replay` on real logs: every request within the window, the contract's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import assert_one_line_error, recap
from tests.conftest import DATA_DIR

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
