"""Recall (``Recap.recall``, ``recap recall``, the ``recap_recall`` tool): every placeholder and
summary names a reference, and the reference gives the original back, page by page, within the
size cap; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine

from recap.core import recall as recalls
from recap.core import service
from recap.core.client import Recap
from recap.core.errors import InputError, NotFoundError
from recap.core.request import refs
from recap.core.settings import get_settings
from recap.core.storage.db import session_scope
from recap.core.storage.sweep import apply_clearings
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from tests.support.cli_helpers import assert_one_line_error, recap
from tests.test_compress_worker import chat
from tests.test_lifecycle import big_output, rich_conversation, tool_turn
from tests.test_media import data_url, png_bytes


def _client(engine: Engine) -> Recap:
    return Recap(get_settings(), engine)


def _import(client: Recap, cid: str, messages: list[dict[str, Any]], **kw: Any) -> list[Any]:
    service.import_conversations(
        client.engine, [{"id": cid, "messages": messages}], client.settings,
        prepare=client._ingest, **kw,
    )  # fmt: skip
    return list(service.export_conversation(client.engine, cid)["messages"])


def _read_all(client: Recap, cid: str, ref: str, cap: int) -> tuple[str, int]:
    """Every page of a recall joined, and how many pages it took."""
    text, offset, pages = "", 0, 0
    while True:
        page = client.recall(cid, ref, offset=offset, max_chars=cap)
        assert len(page.text) <= cap
        text += page.text
        pages += 1
        if page.next_offset is None:
            return text, pages
        offset = page.next_offset


@pytest.mark.parametrize(("ref", "parsed"), [
    ("m42", refs.Ref(refs.MESSAGE, 42)),
    ("ref=s17", refs.Ref(refs.SPAN, 17)),
    ("m9.2", refs.Ref(refs.PART, 9, 2)),
    ("m0", None), ("x1", None), ("m1.", None), ("s1.1", None), ("m" + "9" * 20, None), ("", None),
])  # fmt: skip
def test_parse_ref(ref: str, parsed: refs.Ref | None) -> None:
    assert refs.parse_ref(ref) == parsed
    if parsed is not None:
        assert refs.parse_ref(str(parsed)) == parsed


def test_cleared_placeholder_names_its_ref_and_recall_gives_the_output_back(
    engine: Engine,
) -> None:
    """A cleared result's placeholder says ref=m<id>; recall returns the whole output (from its
    saved file), page by page within the cap, and the pages add up to the original."""
    client = _client(engine)
    output = big_output("recalled")
    messages = _import(client, "r", [*tool_turn("c1", output), {"role": "user", "content": "ok"}])
    tool = next(m for m in messages if m["role"] == "tool")
    assert tool["content"] != output  # cut on the way in
    with session_scope(engine) as session:
        apply_clearings(
            session,
            "r",
            ClearingPlan("idle", (PlannedClearing(message_id=tool["id"], tokens_reclaimed=100),)),
        )
    sent = client.assemble("r").messages
    placeholder = next(m["content"] for m in sent if m["role"] == "tool")
    assert f"ref=m{tool['id']}" in placeholder
    text, pages = _read_all(client, "r", f"m{tool['id']}", 30_000)
    assert pages > 1 and text.endswith(output)
    assert text.splitlines()[0].startswith(f"[tool m{tool['id']} grep")


def test_summary_names_its_span_and_recall_reads_it(engine: Engine) -> None:
    """The summary message ends naming ref=s<cutoff>; recall of it reads the covered messages
    (not the system prompt) in order, in bounded pages."""
    client = _client(engine)
    messages = _import(client, "s", chat(12), max_input_tokens=3_000)
    done = client.compress("s", force=True)
    assert done.action == "summarized" and done.cutoff_message_id is not None
    cutoff = done.cutoff_message_id
    summary_message = client.assemble("s").messages[1]["content"]
    assert summary_message.endswith(refs.summary_note(cutoff))
    text, pages = _read_all(client, "s", f"s{cutoff}", 1_000)
    assert pages > 1
    covered = [m for m in messages[1:] if m["id"] <= cutoff]
    positions = [text.index(m["content"]) for m in covered]
    assert positions == sorted(positions)
    assert messages[0]["content"] not in text
    assert messages[-1]["content"] not in text  # after the cutoff
    first = client.recall("s", f"s{cutoff}", max_chars=1_000)
    assert first.message_ids[0] == covered[0]["id"] and first.truncated


def test_media_part_recall(sqlite_engine: Engine) -> None:
    """A stored screenshot comes back as its part with the bytes, unless over the cap; a text
    part is no media part."""
    client = _client(sqlite_engine)
    messages = _import(client, "p", rich_conversation("a", "b")[:3])
    ref = f"m{messages[1]['id']}.1"  # the first user message: text, then the screenshot
    part = client.recall("p", ref, max_chars=200_000)
    assert part.part is not None
    assert part.part["image_url"]["url"] == data_url(png_bytes(64, 64, pad=60_000, seed=7))
    small = client.recall("p", ref, max_chars=1_000)
    assert small.part is None and "cap" in small.text
    with pytest.raises(NotFoundError):
        client.recall("p", f"m{messages[1]['id']}.0")


def test_bad_references_and_other_conversations(sqlite_engine: Engine) -> None:
    client = _client(sqlite_engine)
    mine = _import(client, "a", chat(1))
    _import(client, "b", chat(1))
    with pytest.raises(InputError, match="not a recall reference"):
        client.recall("a", "42")
    with pytest.raises(NotFoundError):
        client.recall("b", f"m{mine[1]['id']}")  # a message of another conversation
    with pytest.raises(NotFoundError, match="no summary"):
        client.recall("a", f"s{mine[1]['id']}")
    with pytest.raises(NotFoundError, match="unknown conversation"):
        client.recall("nope", "m1")
    assert_one_line_error(recap("recall", "a", "zz"), "not a recall reference")
    assert recap("recall", "a", f"m{mine[1]['id']}", "--json").json()["message_ids"] == [
        mine[1]["id"]
    ]


def test_tool_schema_and_answers() -> None:
    """The published schema, in both formats; an answer is text whatever the arguments."""
    schema = recalls.tool_schema()
    assert schema["function"]["name"] == "recap_recall"
    assert schema["function"]["parameters"]["required"] == ["ref"]
    assert recalls.anthropic_tool()["input_schema"] == schema["function"]["parameters"]
    schema["function"]["name"] = "changed"
    assert recalls.tool_schema()["function"]["name"] == "recap_recall"  # a copy each time
    json.dumps(recalls.anthropic_tool())


def test_answer_is_always_text(sqlite_engine: Engine) -> None:
    client = _client(sqlite_engine)
    mine = _import(client, "a", chat(1))
    settings = client.settings
    ok = recalls.answer(sqlite_engine, "a", json.dumps({"ref": f"m{mine[1]['id']}"}), settings)
    assert mine[1]["content"] in ok
    for bad in ("not json", json.dumps({"ref": 3}), json.dumps({"ref": "m1", "offset": "x"})):
        assert recalls.answer(sqlite_engine, "a", bad, settings).startswith("[recap_recall:")
    assert "not in conversation" in recalls.answer(sqlite_engine, "a", {"ref": "m999"}, settings)
