"""The worker's side of the summarizer's request on the chat's prefix (``core.compression.prefix``):
when the summarizer can share the chat's cache, what the request path keeps of the last request
(``core.request.sentspec``: written only when it changes), the request built again from it and
checked against the recorded one, and each of its messages matched to its stored message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from recap.core.client import Recap
from recap.core.compression import prefix
from recap.core.request import sentspec
from recap.core.settings import Settings
from recap.core.storage import snapshot as snapshots
from recap.core.storage.db import session_scope
from recap.core.storage.models import REQUEST_PROFILES, utcnow
from recap.core.summaries.onprefix import on_prefix
from recap.core.summaries.prompts import DEFAULT_SUMMARY_PROMPT
from recap.core.values.records import ClearingRec, Msg
from recap.core.values.request import ContextFile, RequestSpec

TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
MODEL = "anthropic/claude-sonnet-4-5"


@pytest.mark.parametrize(
    ("summary_model", "chat_model", "shares"),
    [
        ("anthropic/claude-sonnet-4-5", "claude-sonnet-4-5", True),  # provider prefix aside
        ("anthropic/claude-sonnet-4-5", "anthropic/claude-sonnet-4-5", True),
        ("openai/gpt-4o", "gpt-4o", True),
        ("deepseek/deepseek-chat", "deepseek-chat", True),
        ("anthropic/claude-haiku-4-5", "claude-sonnet-4-5", False),  # a cache is per model
        ("gpt-4o-mini", "gpt-4o", False),
        (None, "gpt-4o", False),  # no summary model: the extractive summary
        ("", "gpt-4o", False),
    ],
)
def test_when_the_summarizer_shares_the_chats_cache(
    summary_model: str | None, chat_model: str, shares: bool
) -> None:
    assert prefix.shares_cache(summary_model, chat_model) is shares


@pytest.mark.parametrize(
    "spec",
    [
        RequestSpec(),
        RequestSpec(system="Be brief.", tools=TOOLS),
        RequestSpec(system="Sé breve, ünïcode.", reminder="Answer in JSON.", text_only=True),
        RequestSpec(cache_breakpoints=False, model="gpt-4o", max_input_tokens=9_000),
        RequestSpec(tools=TOOLS, user_id="ada"),
    ],
)
def test_what_a_request_was_given_reads_back_as_it_was(spec: RequestSpec) -> None:
    text, digest = sentspec.encode(spec)
    assert sentspec.decode(text) == spec
    assert sentspec.encode(sentspec.decode(text) or RequestSpec()) == (text, digest)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (RequestSpec(system="a"), RequestSpec(system="b")),
        (RequestSpec(tools=TOOLS), RequestSpec(tools=[*TOOLS, *TOOLS])),
        (RequestSpec(tools=TOOLS), RequestSpec()),
        (RequestSpec(reminder="x"), RequestSpec()),
        (RequestSpec(max_input_tokens=9_000), RequestSpec(max_input_tokens=9_001)),
    ],
)
def test_another_given_part_is_another_hash(one: RequestSpec, other: RequestSpec) -> None:
    assert sentspec.encode(one)[1] != sentspec.encode(other)[1]


@pytest.mark.parametrize(
    "stored", [None, "", "not json", "[1, 2]", json.dumps({"v": 99, "system": "s"})]
)
def test_nothing_readable_stored_reads_as_nothing(stored: str | None) -> None:
    assert sentspec.decode(stored) is None


def msg(ident: int, role: str, content: str, **extra: Any) -> Msg:
    return Msg(id=ident, parent_id=ident - 1 or None, role=role, content=content, tokens=5, **extra)


def marked(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


BRANCH = [msg(1, "system", "sys"), msg(2, "user", "u2"), msg(3, "assistant", "a3")]
BRANCH += [msg(4, "user", "u4"), msg(5, "assistant", "a5")]


@pytest.mark.parametrize(
    ("name", "messages", "ids"),
    [
        (
            "plain",
            [
                {"role": "system", "content": "sys"},
                *({"role": m.role, "content": m.content} for m in BRANCH[1:]),
            ],
            (None, 2, 3, 4, 5),
        ),
        (
            "cache marks aside",
            [
                {"role": "system", "content": marked("sys")},
                {"role": "user", "content": "u2"},
                {"role": "assistant", "content": "a3"},
                {"role": "user", "content": marked("u4")},
            ],
            (None, 2, 3, 4),
        ),
        (
            "a summary and a note match nothing",
            [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "[summary] ..."},
                {"role": "user", "content": "u4"},
                {"role": "assistant", "content": "a5"},
            ],
            (None, None, 4, 5),
        ),
        (
            "an edited message matches nothing, the order holds",
            [
                {"role": "user", "content": "u2 changed"},
                {"role": "assistant", "content": "a3"},
                {"role": "assistant", "content": "a3"},
            ],
            (None, 3, None),
        ),
    ],
)
def test_each_request_message_is_matched_to_its_stored_message(
    name: str, messages: list[dict[str, Any]], ids: tuple[int | None, ...]
) -> None:
    history = prefix.candidates(BRANCH, None)
    got = prefix.message_ids(messages, history, {}, "o200k_base")
    assert got == ids, name


@pytest.mark.parametrize(
    ("cutoff", "first"),
    [(None, 2), (3, 4), (5, None)],
)
def test_the_history_a_request_sends_starts_after_the_prompt_and_the_summary(
    cutoff: int | None, first: int | None
) -> None:
    history = prefix.candidates(BRANCH, cutoff)
    assert (history[0].id if history else None) == first


def test_a_cleared_result_is_matched_as_its_placeholder() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    branch = [
        msg(1, "user", "go"),
        msg(2, "assistant", "", tool_calls=[call]),
        msg(3, "tool", "x" * 400, tool_call_id="c1"),
    ]
    clearings = {3: ClearingRec(message_id=3, reason="cleared", tokens_reclaimed=90)}
    from recap.core.request.assembly import render_stored

    sent = [render_stored(m, clearings, "o200k_base") for m in branch]
    assert "x" * 400 not in json.dumps(sent)  # the placeholder was sent
    assert prefix.message_ids(sent, branch, clearings, "o200k_base") == (1, 2, 3)
    assert prefix.message_ids(sent, branch, {}, "o200k_base") == (1, 2, None)


# --- on a database: what is kept, and the request built again ------------------------------------


@pytest.fixture
def recap(tmp_path: Path) -> Recap:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'p.db'}",
        output_dir=tmp_path / "o",
        summary_model=MODEL,
    )
    return Recap(settings, create_schema=True)


def kept(recap: Recap, cid: str) -> tuple[str | None, str | None]:
    p = REQUEST_PROFILES.c
    with recap.engine.connect() as connection:
        row = connection.execute(
            select(p.sent_spec, p.sent_spec_hash).where(p.conversation_id == cid)
        ).first()
    return (row[0], row[1]) if row is not None else (None, None)


def chat(recap: Recap, cid: str, turns: int = 6) -> None:
    recap.new(cid, model=MODEL)
    for turn in range(turns):
        recap.add(cid, {"role": "user", "content": f"question {turn} " * 30})
        recap.add(cid, {"role": "assistant", "content": f"answer {turn} " * 40})


def rebuilt(recap: Recap, cid: str) -> Any:
    with session_scope(recap.engine) as session:
        snapshot = snapshots.read_snapshot(session, cid, None, now=utcnow())
    return prefix.chat_prefix(recap.engine, recap.settings, snapshot)


def test_the_given_parts_are_kept_when_they_change_and_the_request_is_built_again(
    recap: Recap,
) -> None:
    cid = "kept"
    chat(recap, cid)
    assert rebuilt(recap, cid) is None  # no request recorded yet
    sent = recap.assemble(cid, system="Be precise.", tools=TOOLS)
    text, digest = kept(recap, cid)
    assert text is not None and "Be precise." in text and "grep" in text
    assert digest == sentspec.encode(RequestSpec(system="Be precise.", tools=TOOLS))[1]

    again = rebuilt(recap, cid)
    assert again is not None
    assert json.dumps(list(again.messages)) == json.dumps(sent.messages)  # byte for byte
    assert list(again.tools) == TOOLS
    assert again.ids[0] is None and all(i is not None for i in again.ids[1:])
    span = [i for i in again.ids[1:5] if i is not None]
    request = on_prefix(
        again, model=again.model, summary_id=None, span=span, prompt=DEFAULT_SUMMARY_PROMPT
    )
    assert request is not None and request.shared == sent.messages

    recap.assemble(cid, system="Be precise.", tools=TOOLS)  # the same parts: the same row
    assert kept(recap, cid) == (text, digest)
    recap.assemble(cid, system="Be brief.", tools=TOOLS)
    assert "Be brief." in (kept(recap, cid)[0] or "")


def test_a_request_that_cannot_be_built_as_sent_is_not_used(recap: Recap) -> None:
    cid = "changed"
    chat(recap, cid)
    recap.assemble(cid, system="Be precise.", tools=TOOLS)
    recap.add(cid, {"role": "user", "content": "one more"})  # sent leaf unchanged: still built
    assert rebuilt(recap, cid) is not None
    files = [ContextFile(name="a.txt", text="file text")]
    recap.assemble(cid, system="Be precise.", tools=TOOLS, context_files=files)
    assert rebuilt(recap, cid) is None  # context files are not kept: the own request shape


def test_another_summary_model_builds_nothing(recap: Recap, tmp_path: Path) -> None:
    cid = "other"
    chat(recap, cid)
    recap.assemble(cid, system="Be precise.", tools=TOOLS)
    other = Recap(
        Settings(
            database_url=recap.settings.database_url,
            output_dir=tmp_path / "o",
            summary_model="anthropic/claude-haiku-4-5",
        )
    )
    with session_scope(other.engine) as session:
        snapshot = snapshots.read_snapshot(session, cid, None, now=utcnow())
    assert prefix.chat_prefix(other.engine, other.settings, snapshot) is None
