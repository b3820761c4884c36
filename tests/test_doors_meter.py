"""The doors' measuring parts, without a worker: the provider stand-in's silent truncation check
and image count (``tests/support/content_meter.py``), the sessions' options
(``tests/support/framework_loop.py``), and the table by door ``python -m bench doors`` writes."""

from __future__ import annotations

from typing import Any

from bench import Figure
from bench.__main__ import DOOR_TABLE, _split_door_table, door_table
from tests.support import framework_loop as loop
from tests.support.content_meter import ContentMeter, image_tokens, png_size

OUTPUT = '{"orders": [{"order_id": "A1", "note": "the parcel"}]}'


def request(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": "be brief"}, *messages]}


def user(turn: int, text: str = "where is it") -> dict[str, Any]:
    return {"role": "user", "content": f"turn {turn}: {text}"}


def result(content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_1", "content": content}


def meter() -> ContentMeter:
    counting = ContentMeter(3_000, seed=1)
    counting.originals = {OUTPUT}
    return counting


def test_a_result_sent_whole_or_with_a_note_is_no_silent_truncation() -> None:
    counting = meter()
    assert counting.silences(request(user(0), result(OUTPUT))) == []
    cleared = "[Cleared: the output of lookup (call call_1, 40 tokens) was removed to save context."
    assert counting.silences(request(user(0), result(cleared + "]"))) == []
    shortened = OUTPUT[:20] + "\n[... 30 tokens of this result are left out here to fit]\n"
    assert counting.silences(request(user(0), result(shortened))) == []
    stored = "[Output truncated: 92911 bytes in 1 lines; ... The full output is saved at x.txt]\n"
    assert counting.silences(request(user(0), result(stored + OUTPUT[:20]))) == []


def test_a_result_cut_without_a_note_is_a_silent_truncation() -> None:
    assert meter().silences(request(user(0), result(OUTPUT[:20]))) == [
        "result call_1 changed with no note"
    ]


def test_an_earlier_turn_missing_without_a_summary_is_a_silent_truncation() -> None:
    counting = meter()
    assert counting.silences(request(user(0), user(2))) == [
        "turns [1] left out with no summary or note"
    ]
    summary = {"role": "system", "content": "Summary of the earlier conversation (it ...):\n\nx"}
    assert counting.silences(request(summary, user(2))) == []
    counting.replaced = {1}  # the client edited turn 1 away
    assert counting.silences(request(user(0), user(2))) == []


def test_an_image_costs_by_its_size_not_its_bytes() -> None:
    small, large = loop.png(512, 512), loop.png(1024, 1024)
    assert png_size(small) == (512, 512)
    assert image_tokens(512, 512) == 85 + 170
    assert image_tokens(1024, 1024) == 85 + 170 * 4  # scaled to 768 x 768: four tiles
    counting = meter()

    def costs(url: str) -> int:
        part = {"type": "image_url", "image_url": {"url": url}}
        return counting.count({"messages": [{"role": "user", "content": [part]}]})

    assert costs(large) - costs(small) == 170 * 3


def test_a_draw_without_the_options_is_the_same_session() -> None:
    plain = loop.Draw(7, 6_000, turns=8)
    rich = loop.Draw(7, 6_000, turns=8, images=True, edits=True)
    plain_turns, rich_turns = plain.plan(), rich.plan()
    assert plain.outputs == rich.outputs
    texts = [m if isinstance(m, str) else m[0]["text"] for m, _ in rich_turns]
    assert texts == [m for m, _ in plain_turns]
    assert not plain.edited
    large = loop.Draw(7, 6_000, turns=40, large=True)
    large.plan()
    assert max(len(o) for o in large.outputs.values()) > max(len(o) for o in plain.outputs.values())


def test_the_results_carry_a_table_by_door() -> None:
    figures = [
        Figure("doors_python_api_requests", 12, "", ""),
        Figure("doors_python_api_over_window", 0, "== 0", ""),
        Figure("doors_serve_chat_requests", 13, "", ""),
        Figure("doors_serve_chat_over_window", 2, "== 0", ""),
        Figure("doors_requests_over_window", 2, "== 0", ""),
    ]
    table = door_table(figures)
    assert table[0] == DOOR_TABLE
    assert table[4].startswith("| python_api | 12 | 0 |")
    assert table[5].startswith("| serve_chat | 13 | 2 (NO) |")
    assert len(table) == 6
    kept, found = _split_door_table(["# results", "| `x` | 1 |", "", *table])
    assert kept == ["# results", "| `x` | 1 |"] and found == table
