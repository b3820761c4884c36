"""Reasoning and thinking content: what each provider family is sent back, counted as it is sent.

The "Why" case of the issue: a 500-word block was counted 5 tokens. Here a conversation carries
500 words of reasoning per assistant turn (``reasoning_content`` and Anthropic thinking blocks,
as litellm stores them) and is planned for with those tokens when they are sent and without
them when they are not: in the stored counts, in ``assemble``'s breakdown, and in what the
content-free decisions read.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import Engine, select

from recap.core import service
from recap.core.counting import reasoning, tokens
from recap.core.request.assembly import REASONING_CLEARING
from recap.core.settings import Settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import CLEARINGS, MESSAGES
from recap.core.storage.snapshot import read_snapshot
from recap.core.summaries.planning import request_history_tokens
from recap.core.values.records import Msg
from tests.support.assembling import assemble
from tests.support.token_check import assert_counts_cover, plain_count

WORDS = 500  # the block: 500 words of reasoning per assistant turn
TURNS = 4  # user turns in the shared conversation: enough for older and in-progress turns
ANTHROPIC = "anthropic/claude-sonnet-4-20250514"
DEEPSEEK = "deepseek/deepseek-chat"
OPENAI = "gpt-4o"
WINDOW = 200_000  # every message fits: the tests look at counts, not at truncation


def words(seed: int, count: int = WORDS) -> str:
    rng = random.Random(seed)
    vocabulary = ["check", "file", "parser", "the", "error", "line", "maybe", "retry", "so"]
    return " ".join(rng.choice(vocabulary) + str(rng.randrange(100)) for _ in range(count))


def thinking(seed: int) -> list[dict[str, Any]]:
    return [{"type": "thinking", "thinking": words(seed), "signature": f"sig{seed}" * 8}]


def call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "grep", "arguments": "{}"}}


def agent_conversation(turns: int = TURNS) -> list[dict[str, Any]]:
    """User turns, each answered by a tool call and a final answer, every assistant message with
    500 words of reasoning both ways litellm stores it; the last turn is still in progress."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Fix bug {turn}."})
        step = {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [call(f"call_{turn}")],
            "reasoning_content": words(turn * 10),
            "thinking_blocks": thinking(turn * 10),
        }
        messages.append(step)
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": "found it"})
        if turn < turns - 1:
            messages.append(
                {
                    "role": "assistant",
                    "content": "Fixed.",
                    "reasoning_content": words(turn * 10 + 1),
                    "thinking_blocks": thinking(turn * 10 + 1),
                }
            )
    return messages


def imported(engine: Engine, settings: Settings, model: str, messages: list[dict[str, Any]]) -> str:
    record = {"id": f"conv-{reasoning.family_of(model)}", "messages": messages}
    [(cid, _)] = service.import_conversations(
        engine, [record], settings, model=model, max_input_tokens=WINDOW
    )
    return cid


def stored(engine: Engine, cid: str) -> list[tuple[int, str, int, str]]:
    c = MESSAGES.c
    with engine.connect() as connection:
        rows = connection.execute(
            select(c.id, c.role, c.tokens, c.encoding)
            .where(c.conversation_id == cid)
            .order_by(c.id)
        )
        return [(int(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in rows]


def block_tokens(text: str, encoding: str) -> int:
    return tokens.count_text(text, encoding)


# --- the family table --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("anthropic/claude-3-7-sonnet-20250219", reasoning.ANTHROPIC),
        ("claude-opus-4-1", reasoning.ANTHROPIC),
        ("bedrock/anthropic.claude-sonnet-4", reasoning.ANTHROPIC),
        ("deepseek/deepseek-reasoner", reasoning.DEEPSEEK),
        ("deepseek/deepseek-chat", reasoning.DEEPSEEK),
        ("together_ai/deepseek-ai/DeepSeek-R1", reasoning.OPENAI),
        ("ollama/deepseek-r1:8b", reasoning.OPENAI),
        ("gpt-4o", reasoning.OPENAI),
        ("openai/o3-mini", reasoning.OPENAI),
        ("gemini/gemini-2.5-pro", reasoning.OPENAI),  # Gemini has its own image rule only
        ("", reasoning.OPENAI),
    ],
)
def test_family_of(model: str, family: str) -> None:
    """Each model string maps to the family whose documented rule applies."""
    assert reasoning.family_of(model) == family


STEP = {
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "part", "signature": "s"},
        {"type": "text", "text": "hi"},
    ],
    "tool_calls": [call("c")],
    "reasoning_content": "why",
    "thinking_blocks": [{"type": "redacted_thinking", "data": "xyz"}],
}
ANSWER = {"role": "assistant", "content": "done", "reasoning_content": "why"}


@pytest.mark.parametrize(
    ("family", "message", "in_progress", "text_only", "keys", "thinking_parts"),
    [
        (reasoning.ANTHROPIC, STEP, True, False, {"thinking_blocks"}, 1),
        (reasoning.ANTHROPIC, STEP, False, False, set(), 0),
        (reasoning.ANTHROPIC, STEP, True, True, set(), 0),
        (reasoning.DEEPSEEK, STEP, True, False, {"reasoning_content"}, 0),
        (reasoning.DEEPSEEK, STEP, False, False, {"reasoning_content"}, 0),
        (reasoning.DEEPSEEK, ANSWER, True, False, set(), 0),
        (reasoning.OPENAI, STEP, True, False, set(), 0),
        (reasoning.OPENAI, ANSWER, False, False, set(), 0),
    ],
)
def test_as_sent(
    family: str,
    message: dict[str, Any],
    in_progress: bool,
    text_only: bool,
    keys: set[str],
    thinking_parts: int,
) -> None:
    """What of a message's reasoning each family is sent, and nothing else is touched."""
    sent = reasoning.as_sent(dict(message), family, in_progress=in_progress, text_only=text_only)
    assert {k for k in sent if k in (reasoning.REASONING_KEY, reasoning.BLOCKS_KEY)} == keys
    parts = sent["content"] if isinstance(sent["content"], list) else []
    assert sum(p.get("type") in reasoning.THINKING_TYPES for p in parts) == thinking_parts
    assert sent.get("tool_calls") == message.get("tool_calls")
    if isinstance(message["content"], list):
        assert [p for p in parts if p.get("type") == "text"] == [{"type": "text", "text": "hi"}]
    if keys == {"thinking_blocks"}:  # sent back unchanged and in order
        assert sent["thinking_blocks"] == message["thinking_blocks"]
        assert sent["content"] == message["content"]


def test_count_covers_thinking_text() -> None:
    """A 500-word block is counted as the text it is (the issue saw 5 tokens for it)."""
    text = words(1)
    message = {"role": "assistant", "content": "ok", "reasoning_content": text}
    encoding = tokens.CL100K
    plain = block_tokens(text, encoding)
    assert tokens.count_message(message, encoding) >= plain
    assert tokens.count_message(message, encoding, model=OPENAI) < plain // 10
    blocks = {"role": "assistant", "content": "ok", "thinking_blocks": thinking(1)}
    assert tokens.count_message(blocks, encoding, model=ANTHROPIC) >= plain


# --- a stored conversation, per family ---------------------------------------------------------


def sent_reasoning_tokens(messages: list[dict[str, Any]], encoding: str) -> int:
    return sum(tokens.count_reasoning(m, encoding) for m in messages)


@pytest.mark.parametrize("model", [ANTHROPIC, DEEPSEEK, OPENAI])
def test_planned_with_reasoning_only_when_sent(
    sqlite_engine: Engine, settings: Settings, model: str
) -> None:
    """Stored counts hold the reasoning a message sends while its turn is in progress; the
    request sends (and counts) exactly the family's share; the content-free estimate agrees
    once the request recorded the thinking it no longer sends."""
    cid = imported(sqlite_engine, settings, model, agent_conversation())
    encoding = tokens.encoding_name_for(model)
    rows = stored(sqlite_engine, cid)
    per_block = block_tokens(words(0), encoding)
    assistant = [(mid, count) for mid, role, count, _ in rows if role == "assistant"]
    carrying = model != OPENAI
    for mid, count in assistant:
        assert (count > per_block) == (
            carrying and (model == ANTHROPIC or mid in tool_call_ids(sqlite_engine, cid))
        ), (model, mid, count)

    request = service.assemble(sqlite_engine, cid, settings)
    plain = assert_counts_cover(request, model=model)
    sent = sent_reasoning_tokens(request.messages, encoding)
    assert request.tokens.reasoning == sent
    family = reasoning.family_of(model)
    last_user = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
    for index, message in enumerate(request.messages):
        blocks, content = reasoning.sends(family, message, in_progress=index > last_user)
        assert (reasoning.BLOCKS_KEY in message) == blocks
        assert (reasoning.REASONING_KEY in message) == content
    expected_blocks = {ANTHROPIC: 1, DEEPSEEK: TURNS, OPENAI: 0}[model]
    assert sent >= expected_blocks * per_block * 0.9
    assert sent <= (expected_blocks + 0.5) * per_block
    assert plain > sent  # the plain count is of the request as sent: nothing else is counted
    assert request.tokens.total == tokens.count_messages(request.messages, encoding)

    with session_scope(sqlite_engine) as session:
        snap = read_snapshot(session, cid)
        estimate = request_history_tokens(snap.branch, snap.summary, snap.clearings)
    sent_history = request.tokens.total - tokens.TOKENS_REPLY_PRIMING
    assert estimate == sent_history
    again = service.assemble(sqlite_engine, cid, settings)
    assert again.tokens.as_dict() == request.tokens.as_dict()
    assert again.messages == request.messages


def tool_call_ids(engine: Engine, cid: str) -> set[int]:
    c = MESSAGES.c
    with engine.connect() as connection:
        rows = connection.execute(select(c.id, c.tool_calls).where(c.conversation_id == cid))
        return {int(r[0]) for r in rows if r[1]}


def test_anthropic_records_older_thinking(sqlite_engine: Engine, settings: Settings) -> None:
    """Older turns' thinking is recorded as ``reasoning`` clearings once, with its tokens; the
    turn in progress keeps its blocks, unchanged and in order."""
    messages = agent_conversation()
    cid = imported(sqlite_engine, settings, ANTHROPIC, messages)
    request = service.assemble(sqlite_engine, cid, settings)
    with sqlite_engine.connect() as connection:
        rows = connection.execute(
            select(CLEARINGS.c.message_id, CLEARINGS.c.reason, CLEARINGS.c.tokens_reclaimed)
        ).all()
    older_with_thinking = 2 * (TURNS - 1)
    assert len(rows) == older_with_thinking
    assert {r[1] for r in rows} == {REASONING_CLEARING}
    encoding = tokens.encoding_name_for(ANTHROPIC)
    assert all(int(r[2]) >= block_tokens(words(0), encoding) // 2 for r in rows)
    in_progress = [m for m in request.messages if reasoning.BLOCKS_KEY in m]
    assert [m["thinking_blocks"] for m in in_progress] == [messages[-2]["thinking_blocks"]]


def test_text_only_sends_no_reasoning(sqlite_engine: Engine, settings: Settings) -> None:
    """A text-only request carries no reasoning and counts none."""
    cid = imported(sqlite_engine, settings, ANTHROPIC, agent_conversation())
    request = service.assemble(sqlite_engine, cid, settings, text_only=True)
    assert request.tokens.reasoning == 0
    assert not any(reasoning.carries(m) for m in request.messages)
    assert_counts_cover(request, model=ANTHROPIC)
    plain = plain_count(request.messages, tokens.encoding_name_for(ANTHROPIC))
    assert plain < block_tokens(words(0), tokens.CL100K)  # no block is carried
    exact = tokens.count_messages(request.messages, tokens.encoding_name_for(ANTHROPIC))
    assert request.tokens.total == exact


def test_thinking_as_content_parts(sqlite_engine: Engine, settings: Settings) -> None:
    """Thinking stored as content parts (not ``thinking_blocks``) follows the same rule."""
    messages = agent_conversation(2)
    for message in messages:
        blocks = message.pop("thinking_blocks", None)
        message.pop("reasoning_content", None)
        if blocks:
            message["content"] = [*blocks, {"type": "text", "text": message["content"]}]
    cid = imported(sqlite_engine, settings, ANTHROPIC, messages)
    request = service.assemble(sqlite_engine, cid, settings, cache_breakpoints=False)
    assert_counts_cover(request, model=ANTHROPIC)
    with_parts = [
        m
        for m in request.messages
        if isinstance(m.get("content"), list)
        and any(p.get("type") == "thinking" for p in m["content"])
    ]
    assert [m["content"] for m in with_parts] == [messages[-2]["content"]]
    assert request.tokens.reasoning >= block_tokens(words(10), tokens.CL100K)


# --- seeded random histories -------------------------------------------------------------------


def random_branch(rng: random.Random, model: str) -> list[Msg]:
    """A random agent history with reasoning on some assistant messages, counted as stored."""
    encoding = tokens.encoding_name_for(model)
    raw: list[dict[str, Any]] = []
    for turn in range(rng.randint(1, 5)):
        raw.append({"role": "user", "content": words(rng.randrange(10**6), rng.randint(1, 30))})
        for step in range(rng.randint(0, 3)):
            message: dict[str, Any] = {"role": "assistant", "content": "step"}
            call_id = f"c{turn}_{step}"
            message["tool_calls"] = [call(call_id)]
            decorate(rng, message)
            raw.extend([message, {"role": "tool", "tool_call_id": call_id, "content": "out"}])
        if rng.random() < 0.7:
            answer: dict[str, Any] = {"role": "assistant", "content": "answer"}
            decorate(rng, answer)
            raw.append(answer)
    branch: list[Msg] = []
    for index, message in enumerate(raw, start=1):
        extra = {k: v for k, v in message.items() if k in ("reasoning_content", "thinking_blocks")}
        branch.append(
            Msg(
                index,
                index - 1 or None,
                message["role"],
                message.get("content"),
                tokens.count_message(message, encoding, model=model),
                tuple(message.get("tool_calls") or ()),
                message.get("tool_call_id"),
                extra=extra or None,
            )
        )
    return branch


def decorate(rng: random.Random, message: dict[str, Any]) -> None:
    if rng.random() < 0.6:
        message["reasoning_content"] = words(rng.randrange(10**6), rng.randint(1, 200))
    if rng.random() < 0.6:
        message["thinking_blocks"] = thinking(rng.randrange(10**6))


@pytest.mark.parametrize("seed", range(30))
def test_random_histories_count_what_is_sent(seed: int) -> None:
    """For random histories and families: the breakdown adds up, its reasoning is exactly the
    reasoning the messages carry, the total covers every string, and each family's rule holds."""
    rng = random.Random(seed)
    model = rng.choice([ANTHROPIC, DEEPSEEK, OPENAI, "gpt-3.5-turbo"])
    text_only = rng.random() < 0.2
    branch = random_branch(rng, model)
    request = assemble(branch, model=model, window=WINDOW, safety_margin=0.05, text_only=text_only)
    parts = request.tokens
    assert parts.total == (
        parts.system
        + parts.summary
        + parts.history
        + parts.context
        + parts.tools
        + parts.reminder
        + parts.media
        + parts.reasoning
        + tokens.TOKENS_REPLY_PRIMING
    )
    encoding = tokens.encoding_name_for(model)
    assert parts.reasoning == sent_reasoning_tokens(request.messages, encoding)
    assert_counts_cover(request, model=model)
    exact = tokens.count_messages(request.messages, encoding)
    assert parts.total == exact or text_only
    family = reasoning.family_of(model)
    users = [i for i, m in enumerate(request.messages) if m["role"] == "user"]
    for index, message in enumerate(request.messages):
        in_progress = not users or index > users[-1]
        blocks, content = reasoning.sends(family, message, in_progress=in_progress)
        if text_only:
            blocks = content = False
        assert (reasoning.BLOCKS_KEY in message) <= blocks
        assert (reasoning.REASONING_KEY in message) <= content
