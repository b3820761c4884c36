"""The tool-result policy (pure): previews of oversized outputs and arguments, clearing plans."""

from __future__ import annotations

import json
from typing import Any

import pytest

from recap.core.counting import tokens
from recap.core.decision.toolresults import (
    IDLE,
    POST_SUMMARY,
    PRESSURE,
    min_tokens_for,
    placeholder_tokens_bound,
    plan_clearings,
)
from recap.core.request.placeholders import cleared_placeholder
from recap.core.request.refs import message_ref
from recap.core.request.truncation import (
    Limits,
    byte_size,
    head_tail,
    is_oversized,
    json_preview,
    line_count,
    output_preview,
    trim_arguments,
)
from recap.core.values.records import ClearingRec, Msg
from tests.support.data import DATA_FILES, load_data

LIMITS = Limits(max_lines=2_000, max_bytes=50_000)
WHERE = "/var/recap/outputs/ab/abcdef.txt"


@pytest.mark.parametrize(
    ("text", "oversized"),
    [
        ("short", False),
        ("x" * 50_000, False),
        ("x" * 50_001, True),
        ("é" * 25_001, True),  # 50,002 bytes in UTF-8
        ("a\n" * 2_000, False),
        ("a\n" * 2_001, True),
        ("", False),
    ],
)
def test_is_oversized(text: str, oversized: bool) -> None:
    """An output is oversized when it goes over the byte limit or the line limit."""
    assert is_oversized(text, LIMITS) is oversized


@pytest.mark.parametrize(
    ("text", "lines"), [("", 0), ("a", 1), ("a\n", 1), ("a\nb", 2), ("a\n\n", 2)]
)
def test_line_count(text: str, lines: int) -> None:
    """Lines are counted the way an editor shows them."""
    assert line_count(text) == lines


def _log(lines: int, width: int = 150) -> str:
    return "".join(f"line {i}: {'x' * width}\n" for i in range(lines))


@pytest.mark.parametrize(
    ("text", "max_lines", "max_bytes"),
    [
        (_log(2_000), 400, 10_000),
        (_log(100, 10), 10, 10_000),
        ("y" * 300_000, 400, 10_000),  # one huge line
        ("é" * 100_000, 400, 1_001),  # cut inside a multi-byte character
    ],
)
def test_head_tail_keeps_both_ends_within_budget(text: str, max_lines: int, max_bytes: int) -> None:
    """A head/tail preview starts like the text, ends like it, and stays within the budget."""
    preview, head, tail = head_tail(text, max_lines, max_bytes)
    marker_bytes = 100
    assert byte_size(preview) <= max_bytes + marker_bytes
    assert head + tail <= max_lines
    assert preview[:5] == text[:5]
    assert preview.rstrip("\n")[-5:] == text.rstrip("\n")[-5:]
    assert "omitted" in preview


def test_preview_of_a_300_kb_log_says_where_the_rest_is() -> None:
    """A 300 KB output becomes a ~10 KB preview naming the saved file, its first and last line."""
    text = _log(2_000)
    assert byte_size(text) > 300_000
    preview = output_preview(text, WHERE, LIMITS)
    assert byte_size(preview) < 11_000
    first, _, body = preview.partition("\n")
    assert WHERE in first and f"{byte_size(text)} bytes" in first
    assert body.startswith("line 0: ")
    assert "line 1999: " in body


def _search(hits: int) -> dict[str, Any]:
    return {
        "query": "context window",
        "took_ms": 12,
        "results": [
            {
                "id": f"doc-{i}",
                "title": f"Result {i}",
                "url": f"https://example.org/{i}",
                "score": round(1 - i / 1000, 3),
                "snippet": "s" * 1_000,
                "raw_html": "<p>" + "h" * 2_000 + "</p>",
                "embedding": [0.1] * 50,
            }
            for i in range(hits)
        ],
    }


@pytest.mark.parametrize(
    ("document", "path", "total"),
    [
        (_search(200), ("results",), 200),
        (_search(200)["results"], (), 200),
        ({"response": {"docs": _search(150)["results"]}, "ok": True}, ("response", "docs"), 150),
    ],
)
def test_json_preview_keeps_the_structure(document: Any, path: tuple[str, ...], total: int) -> None:
    """A JSON search result keeps its shape: ids, titles, URLs, scores and short snippets."""
    text = json.dumps(document)
    result = json_preview(text, 10_000)
    assert result is not None
    body, shown = result
    assert byte_size(body) <= 10_000
    preview = json.loads(body)
    hits = preview
    for key in path:
        hits = hits[key]
    assert 5 <= len(hits) < total
    for position, hit in enumerate(hits):
        assert hit["id"] == f"doc-{position}"
        assert hit["url"] == f"https://example.org/{position}"
        assert set(hit) == {"id", "title", "url", "score", "snippet"}
        assert len(hit["snippet"]) < 300
    assert f"of {total} results" in shown


def test_json_preview_of_an_oversized_search_result_is_valid_json_after_its_note() -> None:
    """The stored preview of a big search result is the note line, then parseable JSON."""
    text = json.dumps(_search(400))
    note, _, body = output_preview(text, WHERE, LIMITS).partition("\n")
    assert "of 400 results" in note and WHERE in note
    assert json.loads(body)["query"] == "context window"


@pytest.mark.parametrize(
    "text",
    ["plain text", "[1, 2, 3]", '{"a": "b"}', "{not json", '[{"a": 1}, 2]', "[]"],
)
def test_json_preview_only_for_lists_of_objects(text: str) -> None:
    """Anything but JSON holding a list of objects gets no structured preview."""
    assert json_preview(text, 10_000) is None


def test_trim_write_file_arguments_keeps_valid_json() -> None:
    """A write_file call with a whole file keeps its path and a clipped content, still JSON."""
    arguments = json.dumps({"path": "src/app.py", "content": "print('x')\n" * 2_000})
    trimmed = trim_arguments(arguments, WHERE, 2_000)
    assert trimmed is not None
    parsed = json.loads(trimmed)
    assert parsed["path"] == "src/app.py"
    assert parsed["content"].startswith("print('x')")
    assert WHERE in parsed["content"]
    assert len(trimmed) < 2_400


@pytest.mark.parametrize(
    ("arguments", "changed"),
    [
        ('{"path": "a.py", "content": "short"}', False),
        ("not json " * 500, True),
        (json.dumps({"old_str": "a" * 3_000, "new_str": "b" * 3_000}), True),
    ],
)
def test_trim_arguments_only_when_over_the_limit(arguments: str, changed: bool) -> None:
    """Arguments within the limit are left alone; longer ones are cut to about the limit."""
    trimmed = trim_arguments(arguments, WHERE, 2_000)
    assert (trimmed is not None) is changed
    if trimmed is not None:
        assert len(trimmed) < 2_400


# --- clearing ----------------------------------------------------------------------------------

BIG = 2_000  # tokens of a result worth clearing
SMALL = 40  # tokens of a result smaller than its placeholder


def agent_run(results: list[tuple[str, int]], *, named: bool = True) -> list[Msg]:
    """One user turn, then one assistant call and its result per (tool, tokens)."""
    branch = [Msg(id=1, parent_id=None, role="user", content="go", tokens=5)]
    for tool, size in results:
        call_id = f"call_{len(branch)}"
        call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}
        branch.append(Msg(len(branch) + 1, len(branch), "assistant", None, 20, tool_calls=(call,)))
        branch.append(
            Msg(
                len(branch) + 1,
                len(branch),
                "tool",
                "output",
                size,
                tool_call_id=call_id,
                name=tool if named else None,
            )
        )
    return branch


def cleared_ids(
    branch: list[Msg],
    clearings: dict[int, ClearingRec] | None = None,
    *,
    keep_last: int = 3,
    protected: tuple[str, ...] = ("todo_write",),
    min_tokens: int = 1,
) -> list[int]:
    plan = plan_clearings(
        branch,
        clearings or {},
        keep_last=keep_last,
        protected=protected,
        min_tokens=min_tokens,
        reason=IDLE,
    )
    return plan.message_ids


@pytest.mark.parametrize(
    ("results", "options", "expected"),
    [
        ([("bash", BIG)] * 6, {}, [3, 5, 7]),  # the last 3 calls' results stay
        ([("bash", BIG)] * 3, {}, []),
        ([("bash", BIG)] * 6, {"keep_last": 0}, [3, 5, 7, 9, 11, 13]),
        ([("bash", BIG)] * 6, {"keep_last": 5}, [3]),
        ([("todo_write", BIG), ("bash", BIG), *[("bash", BIG)] * 3], {}, [5]),
        ([("TODO_WRITE", BIG), ("bash", BIG), *[("bash", BIG)] * 3], {}, [5]),
        ([("bash", SMALL), ("bash", BIG), *[("bash", BIG)] * 3], {}, [5]),
        ([("bash", BIG)] * 6, {"min_tokens": 10_000}, []),
        ([("bash", BIG)] * 6, {"min_tokens": 5_000}, [3, 5, 7]),
    ],
)
def test_plan_clearings(
    results: list[tuple[str, int]], options: dict[str, Any], expected: list[int]
) -> None:
    """Old results are cleared; the last N calls, protected tools and small results are kept."""
    assert cleared_ids(agent_run(results), **options) == expected


def test_plan_skips_results_already_cleared() -> None:
    """A result already cleared is not planned again."""
    branch = agent_run([("bash", BIG)] * 6)
    assert cleared_ids(
        branch, {3: ClearingRec(message_id=3, reason=IDLE, tokens_reclaimed=100)}
    ) == [5, 7]


def test_protected_tool_found_through_its_call() -> None:
    """A result without a name is matched to its call's tool name for protection."""
    branch = agent_run([("todo_write", BIG), ("bash", BIG), *[("bash", BIG)] * 3], named=False)
    assert cleared_ids(branch) == [5]


def test_plan_is_deterministic_and_counts_calls_not_turns() -> None:
    """The same branch gives the same plan; a single user turn of many calls still keeps 3."""
    branch = agent_run([("bash", BIG)] * 100)
    first = plan_clearings(branch, {}, keep_last=3, protected=(), min_tokens=1, reason=PRESSURE)
    second = plan_clearings(branch, {}, keep_last=3, protected=(), min_tokens=1, reason=PRESSURE)
    assert first == second
    assert len(first) == 97
    assert first.tokens_reclaimed == sum(item.tokens_reclaimed for item in first.items)
    assert all(0 < item.tokens_reclaimed < BIG for item in first.items)


def test_unknown_reason_is_an_error() -> None:
    """A plan needs one of the known reasons."""
    with pytest.raises(ValueError, match="unknown clearing reason"):
        plan_clearings([], {}, keep_last=3, protected=(), min_tokens=1, reason="whim")


@pytest.mark.parametrize(("reason", "least"), [(PRESSURE, 2_000), (IDLE, 1), (POST_SUMMARY, 1)])
def test_min_tokens_for(reason: str, least: int) -> None:
    """Only pressure asks for the clear-at-least minimum."""
    assert min_tokens_for(reason, 2_000) == least


def test_placeholder_bound_never_understates_the_placeholder() -> None:
    """For every tool result of the shared data, both encodings and every wording, the bound is
    at least the placeholder message's real token count, so tokens_reclaimed never overstates."""
    path = "/srv/recap/outputs/5f/5f886a0b6d1e7ed3a55c378ae0df5baf.txt"
    checked = 0
    for name in DATA_FILES:
        for record in load_data(name):
            for message in record["messages"]:
                if message["role"] != "tool":
                    continue
                size = len(message["content"] or "") + 7
                ref = message_ref(10 ** (size % 19) + size)  # the recall reference, any size
                for saved, exists in ((None, True), (path, True), (path, False)):
                    text = cleared_placeholder(
                        tool_name=message.get("name"),
                        call_id=message["tool_call_id"],
                        tokens=size,
                        output_path=saved,
                        file_exists=exists,
                        ref=ref,
                    )
                    rendered = {**message, "content": text}
                    bound = placeholder_tokens_bound(
                        tool_name=message.get("name"),
                        call_id=message["tool_call_id"],
                        tokens=size,
                        output_path=saved,
                    )
                    for encoding in (tokens.O200K, tokens.CL100K):
                        assert tokens.count_message(rendered, encoding) <= bound
                        checked += 1
    assert checked > 9_000
