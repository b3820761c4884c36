"""The thinking policy and provider items in ``assemble``: the reasoning of the last N user
turns is sent (``Target.thinking_turns``; the turn in progress always, Anthropic's tool loop
intact), older reasoning left out and counted as dropped; a provider item only to the provider
and model that made it, its tokens the provider's count. Table cases, then seeded random
conversations against a reference written from the rule."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from recap.core.counting import reasoning, tokens
from recap.core.values.records import Msg
from tests.support.assembling import assemble

GPT = "openai/gpt-5"
CLAUDE = "anthropic/claude-sonnet-4-5"
WINDOW = 400_000


def item(model: str, n: int, kind: str = "reasoning", tokens_: int | None = 40) -> dict[str, Any]:
    provider = "anthropic" if "claude" in model else "openai"
    raw = json.dumps({"type": kind, "id": f"rs_{n}", "encrypted_content": f"enc{n}" * 20})
    out: dict[str, Any] = {"provider": provider, "model": model, "kind": kind, "at": 0}
    out.update({"raw": raw, "readable": f"thought {n}"})
    if tokens_ is not None:
        out["tokens"] = tokens_
    return out


def conversation(turns: int, steps: int, model: str, made_by: str) -> list[Msg]:
    """``turns`` user turns, each with ``steps`` tool calls before its answer; every assistant
    message carries one provider item of ``made_by`` (the last turn has no answer yet)."""
    out: list[Msg] = []
    n = 0

    def add(role: str, **fields: Any) -> None:
        nonlocal n
        n += 1
        raw = {"role": role, "content": fields.pop("content", None), **fields}
        count = tokens.count_message(raw, tokens.encoding_name_for(model), model=model)
        extra = {"provider_items": fields["provider_items"]} if "provider_items" in fields else None
        calls = tuple(fields.get("tool_calls", ()))
        out.append(
            Msg(
                n,
                n - 1 or None,
                role,
                raw["content"],
                count,
                tool_calls=calls,
                tool_call_id=fields.get("tool_call_id"),
                extra=extra,
            )
        )

    for turn in range(turns):
        add("user", content=f"question {turn}")
        for step in range(steps):
            cid = f"c{turn}_{step}"
            call = {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            add("assistant", tool_calls=[call], provider_items=[item(made_by, n + 1)])
            add("tool", content="out", tool_call_id=cid)
        if turn < turns - 1:
            add("assistant", content=f"answer {turn}", provider_items=[item(made_by, n + 1)])
    return out


def sent_items(messages: list[dict[str, Any]]) -> list[int]:
    """The positions (among assistant messages) of those sent with their provider item."""
    assistants = [m for m in messages if m.get("role") == "assistant"]
    return [i for i, m in enumerate(assistants) if m.get("provider_items")]


def reference(branch: list[Msg], thinking_turns: int, model: str, made_by: str) -> list[int]:
    """The rule as written: an assistant message's item is sent when the target is the model
    that made it and at most ``thinking_turns - 1`` user messages follow it."""
    if reasoning.providers.model_name(model) != reasoning.providers.model_name(made_by):
        return []
    out, position = [], 0
    for index, message in enumerate(branch):
        if message.role != "assistant":
            continue
        later_users = sum(1 for m in branch[index + 1 :] if m.role == "user")
        if later_users < thinking_turns:
            out.append(position)
        position += 1
    return out


CASES = [  # (turns, steps, thinking_turns, target, made_by)
    (3, 2, 1, GPT, GPT),
    (3, 2, 2, GPT, GPT),
    (3, 2, 9, GPT, GPT),
    (3, 2, 1, CLAUDE, CLAUDE),
    (4, 1, 2, CLAUDE, CLAUDE),
    (3, 2, 3, GPT, "openai/gpt-5-mini"),  # another model: never
    (3, 2, 3, CLAUDE, GPT),  # another provider: never
    (1, 3, 1, GPT, GPT),  # only the tool loop in progress
]


@pytest.mark.parametrize(("turns", "steps", "keep", "target", "made_by"), CASES)
def test_items_sent_by_the_rule(
    turns: int, steps: int, keep: int, target: str, made_by: str
) -> None:
    branch = conversation(turns, steps, target, made_by)
    result = assemble(branch, model=target, window=WINDOW, safety_margin=0.0, thinking_turns=keep)
    assert sent_items(result.messages) == reference(branch, keep, target, made_by)
    for message in result.messages:  # an item is sent as stored, byte for byte
        for sent in message.get("provider_items") or ():
            assert sent["raw"] in {
                i["raw"] for m in branch for i in (m.extra or {}).get("provider_items", ())
            }


def test_dropped_reasoning_counted_and_recorded() -> None:
    branch = conversation(4, 2, GPT, GPT)
    everything = assemble(branch, model=GPT, window=WINDOW, safety_margin=0.0, thinking_turns=9)
    policy = assemble(branch, model=GPT, window=WINDOW, safety_margin=0.0, thinking_turns=1)
    # the turn in progress sends 2 items of 40 tokens; all 11 assistant messages: 11 items
    assert everything.tokens.reasoning == 11 * 40
    assert policy.tokens.reasoning == 2 * 40
    assert everything.tokens.total - policy.tokens.total == 9 * 40
    # the older messages whose item is left out are recorded as reasoning cleared
    assert len(policy.reasoning_dropped) == 9
    assert all(dropped == 40 for _id, dropped in policy.reasoning_dropped)


def test_item_tokens_estimated_without_usage() -> None:
    unknown = item(GPT, 1, tokens_=None)
    assert reasoning.item_tokens(unknown) == max(len("thought 1") // 4, 1)
    assert reasoning.item_tokens(item(GPT, 1, tokens_=7)) == 7


def test_text_only_sends_no_item() -> None:
    branch = conversation(2, 1, GPT, GPT)
    result = assemble(branch, model=GPT, window=WINDOW, safety_margin=0.0, text_only=True)
    assert sent_items(result.messages) == []


@pytest.mark.parametrize("seed", range(12))
def test_random_conversations_follow_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    turns, steps, keep = rng.randint(1, 6), rng.randint(0, 3), rng.randint(1, 7)
    target = rng.choice([GPT, CLAUDE])
    made_by = target if rng.random() < 0.75 else rng.choice([GPT, CLAUDE, "openai/o4-mini"])
    branch = conversation(turns, steps, target, made_by)
    if not any(m.role == "assistant" for m in branch):
        return
    result = assemble(branch, model=target, window=WINDOW, safety_margin=0.0, thinking_turns=keep)
    assert sent_items(result.messages) == reference(branch, keep, target, made_by)
