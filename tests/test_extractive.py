"""The offline extractive summarizer: the template filled from the messages, pure."""

from __future__ import annotations

import json

import pytest

from recap.core.counting import tokens
from recap.core.summaries.extractive import extractive_summary, parse_sections
from recap.core.summaries.identifiers import identifiers_of_span, retention
from recap.core.summaries.prompts import EXTRACTIVE_NOTE, SUMMARY_SECTIONS
from recap.core.values.records import Msg
from tests.support.data import DATA_FILES, load_data


def as_msgs(messages: list[dict[str, object]]) -> list[Msg]:
    out = []
    for i, m in enumerate(messages, start=1):
        content = m.get("content")
        out.append(
            Msg(
                id=i,
                parent_id=i - 1 or None,
                role=str(m["role"]),
                content=content if isinstance(content, str) else None,
                tokens=tokens.count_message(m, tokens.O200K),
                tool_calls=tuple(m.get("tool_calls") or ()),  # type: ignore[arg-type]
                tool_call_id=m.get("tool_call_id"),  # type: ignore[arg-type]
                name=m.get("name"),  # type: ignore[arg-type]
            )
        )
    return out


SMALL = as_msgs(
    [
        {"role": "user", "content": "Fix the crash in src/app.py. Please do not touch tests/."},
        {
            "role": "assistant",
            "content": "I'll run the tests first.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": json.dumps({"command": "pytest -x tests"}),
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "bash",
            "content": "E   KeyError: 'user'\nFAILED tests/test_app.py - KeyError: 'user'",
        },
        {"role": "assistant", "content": "The issue is a missing key; I will add a default."},
        {"role": "user", "content": "Good, go ahead."},
    ]
)


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ("Goal", "Fix the crash in src/app.py"),
        ("Constraints and preferences", "Please do not touch tests/."),
        ("Done", 'bash({"command": "pytest -x tests"})'),
        ("Blocked", "KeyError: 'user'"),
        ("Key decisions", "The issue is a missing key; I will add a default."),
        ("Next steps", "Good, go ahead."),
        ("Relevant files", "`src/app.py`"),
        ("Identifiers", "`KeyError`"),
    ],
)
def test_sections_filled_from_messages(section: str, fragment: str) -> None:
    """Each section quotes what the messages say, verbatim."""
    sections = parse_sections(extractive_summary(SMALL))
    assert any(fragment in item for item in sections[section]), sections[section]


def test_says_it_is_extractive_and_has_every_section() -> None:
    """The output names itself extractive and carries the whole template."""
    text = extractive_summary(SMALL)
    assert text.startswith(EXTRACTIVE_NOTE)
    assert all(f"## {name}" in text for name in SUMMARY_SECTIONS)


def test_merges_into_the_previous_summary() -> None:
    """Given a previous summary it keeps the first goal and adds what is new."""
    first = extractive_summary(SMALL[:3])
    second = extractive_summary(SMALL[3:], previous_summary=first)
    sections = parse_sections(second)
    assert any("Fix the crash" in item for item in sections["Goal"])
    assert any("go ahead" in item for item in sections["Next steps"])
    assert any("pytest -x tests" in item for item in sections["Done"])


def test_is_deterministic() -> None:
    """The same messages give the same bytes."""
    assert extractive_summary(SMALL) == extractive_summary(SMALL)


@pytest.mark.parametrize("name", DATA_FILES)
def test_bounded_and_keeps_identifiers_on_real_runs(name: str) -> None:
    """On real conversations, summarized in halves, it stays far smaller than what it replaces
    and keeps most identifiers."""
    for record in load_data(name)[:10]:
        messages = as_msgs(record["messages"])
        half = len(messages) // 2
        first = extractive_summary(messages[:half])
        second = extractive_summary(messages[half:], previous_summary=first)
        assert tokens.count_text(second, tokens.O200K) < 4_000
        assert retention(identifiers_of_span(messages[half:]), second).score >= 0.5
