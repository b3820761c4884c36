"""The summarizer's request on the chat's prefix (``core.summaries.onprefix``): the chat's last
assembled request byte for byte (cache marks and tools included) up to the instruction, and the
old shape where the prefix cannot serve."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from recap.core.request.assembly import StoredBranch, Target, assemble
from recap.core.summaries.onprefix import SentRequest, on_prefix
from recap.core.summaries.prompts import DEFAULT_SUMMARY_PROMPT
from recap.core.values.records import Msg
from recap.core.values.request import RequestSpec

MODEL = "anthropic/claude-sonnet-4-5"
TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]


def branch(turns: int) -> list[Msg]:
    messages = [Msg(id=1, parent_id=None, role="system", content="Be precise.", tokens=8)]
    for turn in range(turns):
        ident = len(messages) + 1
        messages.append(
            Msg(
                id=ident,
                parent_id=ident - 1,
                role="user",
                content=f"question {turn} " * 20,
                tokens=60,
            )
        )
        messages.append(
            Msg(
                id=ident + 1,
                parent_id=ident,
                role="assistant",
                content=f"answer {turn} " * 30,
                tokens=80,
            )
        )
    return messages


def sent_request(turns: int = 8) -> tuple[SentRequest, list[Msg], list[dict[str, Any]]]:
    stored = branch(turns)
    built = assemble(
        StoredBranch(branch=stored, summary=None, clearings={}),
        RequestSpec(tools=TOOLS),
        target=Target(model=MODEL, window=200_000, safety_margin=0.05),
    )
    assert len(built.messages) == len(stored)  # nothing left out: the ids follow the branch
    ids = (None, *(m.id for m in stored[1:]))
    sent = SentRequest(
        model=MODEL, messages=tuple(built.messages), ids=ids, tools=tuple(TOOLS), summary_id=None
    )
    return sent, stored, built.messages


def test_shares_the_chats_prefix_byte_for_byte() -> None:
    sent, stored, messages = sent_request()
    assert any("cache_control" in json.dumps(m) for m in messages)  # marks are part of it
    span = [m.id for m in stored[1:9]]
    request = on_prefix(
        sent, model=MODEL, summary_id=None, span=span, prompt=DEFAULT_SUMMARY_PROMPT
    )
    assert request is not None
    assert json.dumps(request.shared, sort_keys=False) == json.dumps(messages, sort_keys=False)
    assert request.tools == TOOLS
    instruction = request.messages[-1]
    assert instruction["role"] == "user" and "CUTOFF" in instruction["content"]
    assert "first 8 messages" in instruction["content"]
    assert repr(stored[8].content[:40])[1:-1] in instruction["content"]  # the cutoff, quoted


@pytest.mark.parametrize(
    ("name", "change", "span"),
    [
        ("another model", {"model": "gpt-4o"}, range(2, 8)),
        ("another summary sent", {"summary_id": 7}, range(2, 8)),
        ("the span does not begin the request", {}, range(4, 8)),
        ("a span message was not sent", {}, [2, 3, 99]),
        ("an empty span", {}, []),
        ("no prefix cache", {"cacheable": False}, range(2, 8)),
    ],
)
def test_the_old_shape_where_the_prefix_cannot_serve(
    name: str, change: dict[str, Any], span: Any
) -> None:
    sent, _, _ = sent_request()
    args: dict[str, Any] = {"model": MODEL, "summary_id": None, "cacheable": True}
    args.update(change)
    assert on_prefix(sent, span=list(span), prompt=DEFAULT_SUMMARY_PROMPT, **args) is None, name


def reference(ids: list[int | None], span: list[int]) -> bool:
    """The prefix serves when the span starts at the request's first stored message and every
    message of it was sent, in its order."""
    stored = [mid for mid in ids if mid is not None]
    if not span or not stored or stored[0] != span[0]:
        return False
    if not set(span) <= set(stored):
        return False
    return [mid for mid in stored if mid in set(span)] == span


def test_random_spans_against_a_reference() -> None:
    rng = random.Random(7)
    for _ in range(500):
        count = rng.randrange(1, 12)
        ids: list[int | None] = [None, *range(10, 10 + count)]
        if rng.random() < 0.3:
            ids.insert(rng.randrange(1, len(ids) + 1), None)  # a stub or a context file
        messages = tuple({"role": "user", "content": f"m{i}"} for i in range(len(ids)))
        sent = SentRequest(model=MODEL, messages=messages, ids=tuple(ids))
        stored = [mid for mid in ids if mid is not None]
        start = rng.choice([0, 0, 0, rng.randrange(len(stored))])
        span = stored[start : start + rng.randrange(0, len(stored) + 1)]
        if span and rng.random() < 0.2:
            span.append(999)
        got = on_prefix(
            sent, model=MODEL, summary_id=None, span=span, prompt=DEFAULT_SUMMARY_PROMPT
        )
        assert (got is not None) == reference(list(ids), span), (ids, span)
        if got is not None:
            assert got.shared == list(messages)
