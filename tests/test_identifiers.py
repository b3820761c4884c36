"""Identifier extraction and the retention score, as tables of plain values."""

from __future__ import annotations

import pytest

from recap.core.summaries.identifiers import (
    command_of_call,
    identifiers_in_text,
    identifiers_of_message,
    retention,
)
from recap.core.values.records import Msg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see https://example.com/a/b?x=1.", {"https://example.com/a/b?x=1"}),
        ("edit src/app/main.py and /etc/hosts", {"src/app/main.py", "/etc/hosts"}),
        ("run ./build.sh then open setup.py", {"./build.sh", "setup.py"}),
        ("it raised KeyError and a ValueError", {"KeyError", "ValueError"}),
        (
            "commit f8a2feebba3aea298bde89d445ad35ca48602ca7",
            {"f8a2feebba3aea298bde89d445ad35ca48602ca7"},
        ),
        ("id 123e4567-e89b-12d3-a456-426614174000", {"123e4567-e89b-12d3-a456-426614174000"}),
        ("booking 8JX2WO on flight HAT039", {"8JX2WO", "HAT039"}),
        ("my user id is mia_li_3668", {"mia_li_3668"}),
        ("and/or n/a silver/gold, e.g. U.S. and OK", set()),
        ("", set()),
    ],
)
def test_identifiers_in_text(text: str, expected: set[str]) -> None:
    """URLs, paths, error names and ids are found as written; prose is not."""
    assert identifiers_in_text(text) == expected


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"command": "pytest -x tests/test_a.py"}', "pytest -x tests/test_a.py"),
        ('{"cmd": "make clean\\nmake"}', "make clean"),
        ('{"command": "view"}', None),  # a one-word sub-command is not a command line
        ('{"path": "a.py"}', None),
        ("not json", None),
        ("", None),
    ],
)
def test_command_of_call(arguments: str, expected: str | None) -> None:
    """The first line of a shell-like call's command, when it is a command line."""
    assert command_of_call(arguments) == expected


def test_tool_results_contribute_only_error_names() -> None:
    """A tool result's paths are data; the error it raised is an identifier."""
    result = Msg(
        2, 1, "tool", "a.py b.py c.py\nTraceback...\nModuleNotFoundError: x", 9, tool_call_id="c"
    )
    assert identifiers_of_message(result) == {"ModuleNotFoundError"}


def test_calls_contribute_arguments_and_commands() -> None:
    """A tool call's argument paths and its command line are identifiers."""
    calls = (
        {
            "id": "c",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "cat docs/setup.md"}'},
        },
    )
    message = Msg(1, None, "assistant", "Reading `git log -3` output next.", 9, tool_calls=calls)
    assert identifiers_of_message(message) == {"cat docs/setup.md", "docs/setup.md", "git log -3"}


@pytest.mark.parametrize(
    ("identifiers", "summary", "score", "missing"),
    [
        ({"a.py", "KeyError"}, "fixed KeyError in a.py", 1.0, ()),
        ({"a.py", "KeyError"}, "fixed a.py", 0.5, ("KeyError",)),
        ({"a.py", "b.py", "c.py", "d.py"}, "nothing", 0.0, ("a.py", "b.py", "c.py", "d.py")),
        (set(), "anything", 1.0, ()),
    ],
)
def test_retention(
    identifiers: set[str], summary: str, score: float, missing: tuple[str, ...]
) -> None:
    """The share of identifiers found verbatim, and the ones missing, sorted."""
    kept = retention(identifiers, summary)
    assert kept.score == score
    assert kept.missing == missing
    assert kept.total == len(identifiers)
