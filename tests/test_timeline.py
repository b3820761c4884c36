"""The timeline (``recap timeline``) and the request as of a time (``recap assemble --as-of``).

The states come from ``core.request.timeline.derive`` over the request ``assemble`` built: a table
of small branches for each state, then the real pipeline on SQLite and PostgreSQL (a summary,
clearings, media, a branch), and the request as of a moment before a summary, byte for byte the
one assembled then.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select

from recap.core import lifecycle, service
from recap.core.client import Recap
from recap.core.counting import media
from recap.core.request.timeline import STATES, derive
from recap.core.settings import get_settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import REQUEST_PROFILES
from recap.core.storage.sweep import apply_clearings
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from recap.core.values.records import ClearingRec, Msg, SummaryRec
from tests.support import assembling
from tests.support.cli_helpers import assert_one_line_error, recap
from tests.test_compress_worker import chat
from tests.test_lifecycle import big_output, rich_conversation, tool_turn

MODEL = "gpt-4o-mini"


def msg(mid: int, role: str, tokens: int = 10, **kw: Any) -> Msg:
    return Msg(mid, mid - 1 if mid > 1 else None, role, kw.pop("content", f"m{mid}"), tokens, **kw)


def call(mid: int, call_id: str) -> Msg:
    calls = ({"id": call_id, "type": "function", "function": {"name": "ls", "arguments": "{}"}},)
    return msg(mid, "assistant", content=None, tool_calls=calls)


def result(mid: int, call_id: str, tokens: int = 500) -> Msg:
    return msg(mid, "tool", tokens, tool_call_id=call_id, name="ls")


def states_of(branch: list[Msg], **kw: Any) -> dict[int, str]:
    summary = kw.pop("summary", None)
    clearings = kw.pop("clearings", {})
    window = kw.pop("window", 100_000)
    system = kw.pop("system", None)
    request = assembling.assemble(
        branch,
        model=MODEL,
        window=window,
        safety_margin=0.0,
        summary=summary,
        clearings=clearings,
        system=system,
    )
    line = derive(
        branch,
        request,
        summaries=[summary] if summary else [],
        clearings=clearings,
        system_given=system is not None,
        **kw,
    )
    return {m.id: m.state for m in line.messages}


SYSTEM = msg(1, "system", 5)
BASE = [SYSTEM, msg(2, "user"), call(3, "a"), result(4, "a"), msg(5, "assistant"), msg(6, "user")]


@pytest.mark.parametrize(
    ("case", "kwargs", "expected"),
    [
        ("all full", {}, {1: "full", 2: "full", 3: "full", 4: "full", 5: "full", 6: "full"}),
        (
            "cleared result",
            {"clearings": {4: ClearingRec(message_id=4, reason="idle", tokens_reclaimed=450)}},
            {1: "full", 2: "full", 3: "full", 4: "cleared", 5: "full", 6: "full"},
        ),
        (
            "summarized span, system prompt still sent",
            {
                "summary": SummaryRec(
                    id=9, cutoff_message_id=4, previous_summary_id=None, text="the story", tokens=20
                )
            },
            {1: "full", 2: "summarized", 3: "summarized", 4: "summarized", 5: "full", 6: "full"},
        ),
        (
            "left out to fit the budget",
            {"window": 120},
            {1: "full", 2: "omitted", 3: "omitted", 4: "omitted", 5: "full", 6: "full"},
        ),
        (
            "stored prompt replaced by the host's",
            {"system": "another prompt"},
            {1: "omitted", 2: "full", 3: "full", 4: "full", 5: "full", 6: "full"},
        ),
        (
            "a pinned message",
            {
                "summary": SummaryRec(
                    id=9, cutoff_message_id=4, previous_summary_id=None, text="the story", tokens=20
                ),
                "pinned": [2],
            },
            {1: "full", 2: "pinned", 3: "summarized", 4: "summarized", 5: "full", 6: "full"},
        ),
    ],
)
def test_each_state_from_the_request(case: str, kwargs: dict[str, Any], expected: Any) -> None:
    assert states_of(list(BASE), **kwargs) == expected, case


def test_aged_media_and_the_tokens_each_state_costs() -> None:
    """A message whose media is recorded as aged is ``aged``; a cleared result costs its
    placeholder, a summarized or omitted message nothing; every state is counted."""
    image = {"type": "image_url", "image_url": {"url": "https://x/y.png"}, media.META_KEY: {}}
    with_media = msg(2, "user", 800, content=None, content_parts=({"type": "text", "text": "a"},))
    with_media = with_media._replace(content_parts=({"type": "text", "text": "a"}, image))
    branch = [SYSTEM, with_media, call(3, "a"), result(4, "a"), msg(5, "assistant"), msg(6, "user")]
    clearings = {
        2: ClearingRec(message_id=2, reason=media.RECORDED, tokens_reclaimed=700),
        4: ClearingRec(message_id=4, reason="idle", tokens_reclaimed=450),
    }
    request = assembling.assemble(
        branch, model=MODEL, window=100_000, safety_margin=0.0, clearings=clearings
    )
    line = derive(branch, request, clearings=clearings)
    by_id = {m.id: m for m in line.messages}
    assert by_id[2].state == "aged" and by_id[2].sent_tokens == 100
    assert by_id[4].state == "cleared" and by_id[4].sent_tokens == 50
    assert by_id[4].reason == "idle" and by_id[4].tool == "ls"
    counts = line.as_dict()["states"]
    assert list(counts) == list(STATES) and counts["aged"] == 1 and counts["full"] == 4


def test_summary_spans_follow_each_other() -> None:
    """Each summary on the branch spans the messages after the previous one's cutoff."""
    branch = [SYSTEM, *(msg(n, "user" if n % 2 == 0 else "assistant") for n in range(2, 12))]
    first, second = (
        SummaryRec(id=1, cutoff_message_id=5, previous_summary_id=None, text="one", tokens=10),
        SummaryRec(id=2, cutoff_message_id=9, previous_summary_id=1, text="two", tokens=12),
    )
    request = assembling.assemble(branch, model=MODEL, window=100_000, safety_margin=0.0,
                                summary=second)  # fmt: skip
    spans = derive(branch, request, summaries=[second, first]).summaries
    assert [(s.id, s.first_message_id, s.cutoff_message_id, s.messages, s.sent) for s in spans] == [
        (1, 2, 5, 4, False),
        (2, 6, 9, 4, True),
    ]


# --- the real pipeline ---------------------------------------------------------------------------


def _sent_ids(line: dict[str, Any]) -> list[int]:
    return [m["id"] for m in line["messages"] if m["state"] in ("full", "aged", "cleared")]


def test_timeline_and_as_of_through_a_summary(engine: Engine) -> None:
    """Before and after a summary: the states follow the request, the files and media of the
    summarized span are in forgotten_files, the timeline writes nothing, and the request as of
    a moment before the summary is byte for byte the one assembled then."""
    client = Recap(get_settings(), engine)
    messages = rich_conversation(big_output("shared"), big_output("own"))
    service.import_conversations(
        engine, [{"id": "t", "messages": messages}], client.settings, max_input_tokens=6_000,
        prepare=client._ingest,
    )  # fmt: skip
    then = client.assemble("t", system="You are careful.")
    before = lifecycle.timeline(engine, "t", client.settings).as_dict()
    assert before["summaries"] == [] and before["states"]["summarized"] == 0
    assert before["states"]["omitted"] > 0  # the window cannot hold every output
    assert sorted(before["states"].values()) and sum(before["states"].values()) == len(messages)
    moment = datetime.now(UTC)
    time.sleep(0.01)

    done = client.compress("t", force=True)
    assert done.action == "summarized"
    profile = _profile(engine)
    after = lifecycle.timeline(engine, "t", client.settings).as_dict()
    assert _profile(engine) == profile  # the timeline recorded nothing
    (span,) = after["summaries"]
    assert span["sent"] and span["cutoff_message_id"] == done.cutoff_message_id
    summarized = [m for m in after["messages"] if m["state"] == "summarized"]
    assert len(summarized) == span["messages"] and summarized[-1]["id"] == span["cutoff_message_id"]
    assert all(m["summary_id"] == span["id"] for m in summarized)
    now = client.assemble("t", system="You are careful.")
    assert now.summary_id == span["id"]
    assert any(name.endswith(".txt") for name in now.forgotten_files)
    assert any(name.endswith(".png") for name in now.forgotten_files)  # the screenshot's name
    assert after["forgotten_files"] == now.forgotten_files

    old = client.assemble("t", system="You are careful.", as_of=moment)
    assert old.summary_id is None and old.messages == then.messages
    assert old.forgotten_files == []
    as_of = lifecycle.timeline(engine, "t", client.settings, as_of=moment).as_dict()
    assert as_of["states"] == before["states"]


def _profile(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return [tuple(r) for r in connection.execute(select(REQUEST_PROFILES))]


def test_timeline_follows_the_branch_and_clearings(sqlite_engine: Engine) -> None:
    """A cleared result is ``cleared`` with its reason; a fork shows its own branch only."""
    client = Recap(get_settings(), sqlite_engine)
    service.import_conversations(
        sqlite_engine, [{"id": "b", "messages": [*chat(1), *tool_turn("c1", "x " * 800)]}],
        client.settings,
    )  # fmt: skip
    exported = service.export_conversation(sqlite_engine, "b")["messages"]
    tool_id = next(m["id"] for m in exported if m["role"] == "tool")
    with session_scope(sqlite_engine) as session:
        apply_clearings(
            session,
            "b",
            ClearingPlan("idle", (PlannedClearing(message_id=tool_id, tokens_reclaimed=700),)),
        )
    fork = client.add("b", {"role": "user", "content": "another way"}, parent_id=exported[2]["id"])
    main = lifecycle.timeline(sqlite_engine, "b", client.settings, leaf=exported[-1]["id"])
    row = next(m for m in main.messages if m.id == tool_id)
    assert (row.state, row.reason) == ("cleared", "idle")
    other = lifecycle.timeline(sqlite_engine, "b", client.settings, leaf=fork)
    assert [m.id for m in other.messages] == [*(m["id"] for m in exported[:3]), fork]


def test_cli_timeline_and_as_of_errors(sqlite_engine: Engine) -> None:
    service.import_conversations(sqlite_engine, [{"id": "c", "messages": chat(2)}], get_settings())
    line = recap("timeline", "c", "--json").json()
    assert [m["state"] for m in line["messages"]] == ["full"] * 5
    assert set(line) >= {"messages", "summaries", "states", "request_tokens", "budget"}
    assert_one_line_error(recap("assemble", "c", "--as-of", "soon"), "ISO 8601")
    assert_one_line_error(recap("assemble", "c", "--as-of", "2001-01-01"), "no message")
    assert_one_line_error(recap("timeline", "nope"), "unknown conversation")
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert recap("assemble", "c", "--as-of", later, "--json").json()["summary_id"] is None
    assert recap("timeline", "c", "--as-of", later, "--json").json()["states"]["full"] == 5
