"""The request view's promises, checked on a thousand seeded random branches: every tool call
answered exactly once right after it, no stray result, the total within the budget and equal to
a recount of what is sent, the kept history one contiguous newest run, every message either sent
or reported dropped, and the same bytes for the same state. The branches mix what real agents
produce and what broken imports can hold: parallel calls, results out of order, orphan results,
calls never answered, repeated call ids, cleared results, system messages mid-way, a summary at
any point."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from recap.core.counting import tokens
from recap.core.errors import BudgetError
from recap.core.request.assembly import AssembledRequest
from recap.core.request.placeholders import cleared_placeholder
from recap.core.request.refs import message_ref, summary_note
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.core.values.records import ClearingRec, Msg, SummaryRec
from tests.support.assembling import assemble
from tests.test_assembly import check_request

MODEL = "gpt-4o-mini"
ENCODING = tokens.encoding_name_for(MODEL)
CASES = 1_000
WINDOWS = (60, 150, 400, 1_000, 5_000, 100_000)  # from nothing fits to everything fits
MAX_MESSAGES = 40
WORDS = ("alpha", "beta", "gamma", "delta", "src/app.py", "pytest -k parse", "ValueError:", "42")


def _text(rng: random.Random, tag: str) -> str:
    """A unique tag (so a sent message can be traced to its id) and a few random words."""
    return tag + " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30)))


def _message(rng: random.Random, mid: int, pending: list[str], used: list[str]) -> dict[str, Any]:
    """One random message, given the calls still unanswered and every call id used so far."""
    tag = f"m{mid}"
    roll = rng.random()
    if roll < 0.25:
        return {"role": "user", "content": _text(rng, tag)}
    if roll < 0.4:
        return {"role": "assistant", "content": _text(rng, tag)}
    if roll < 0.6:
        ids = []
        for _ in range(rng.randint(1, 3)):
            reused = used and rng.random() < 0.1  # an id used before: broken, but it happens
            ids.append(rng.choice(used) if reused else f"call_{mid}_{len(ids)}")
        used.extend(ids)
        pending.extend(ids)
        calls = [
            {"id": cid, "type": "function", "function": {"name": "bash", "arguments": tag}}
            for cid in ids
        ]
        return {"role": "assistant", "content": rng.choice([None, tag]), "tool_calls": calls}
    if roll < 0.9:
        if pending and rng.random() < 0.85:
            answer = pending.pop(rng.randrange(len(pending)))  # in any order
        else:
            answer = rng.choice([*used, "call_orphan"]) if used else "call_orphan"
        return {"role": "tool", "content": _text(rng, tag), "tool_call_id": answer, "name": "bash"}
    return {"role": "system", "content": _text(rng, tag)}


def random_case(seed: int) -> dict[str, Any]:
    """A branch, clearings, a summary (or none), a window and knobs, all from ``seed``."""
    rng = random.Random(seed)
    pending: list[str] = []
    used: list[str] = []
    branch: list[Msg] = []
    if rng.random() < 0.7:
        branch.append(_msg(1, None, {"role": "system", "content": _text(rng, "m1")}))
    for _ in range(rng.randint(1, MAX_MESSAGES)):
        mid = len(branch) + 1
        parent = branch[-1].id if branch else None
        branch.append(_msg(mid, parent, _message(rng, mid, pending, used)))
    if not any(m.role == "user" for m in branch[1:]):
        mid = len(branch) + 1
        branch.append(_msg(mid, branch[-1].id, {"role": "user", "content": f"m{mid}"}))
    clearings = {m.id: _clearing(m) for m in branch if m.role == "tool" and rng.random() < 0.3}
    summary = None
    if rng.random() < 0.3 and len(branch) > 2:
        cutoff = rng.choice(branch[:-1]).id
        summary = SummaryRec(
            id=7,
            cutoff_message_id=cutoff,
            previous_summary_id=None,
            text=_text(rng, "summary"),
            tokens=0,
        )
        summary = SummaryRec(
            id=7,
            cutoff_message_id=cutoff,
            previous_summary_id=None,
            text=summary.text,
            tokens=_count_summary(summary.text, cutoff),
        )
    return {
        "branch": branch,
        "clearings": clearings,
        "summary": summary,
        "window": rng.choice(WINDOWS),
        "safety_margin": rng.choice([0.0, 0.05]),
        "reminder": rng.choice([None, "Reminder: m-reminder"]),
        "system": rng.choice([None, None, "Given system prompt"]),
    }


def _msg(mid: int, parent: int | None, message: dict[str, Any]) -> Msg:
    return Msg(
        id=mid,
        parent_id=parent,
        role=message["role"],
        content=message.get("content"),
        tokens=tokens.count_message(message, ENCODING),
        tool_calls=tuple(message.get("tool_calls") or ()),
        tool_call_id=message.get("tool_call_id"),
        name=message.get("name"),
    )


def _placeholder(message: Msg) -> dict[str, Any]:
    text = cleared_placeholder(
        tool_name=message.name, call_id=message.tool_call_id or "", tokens=message.tokens,
        output_path=None, file_exists=True, ref=message_ref(message.id),
    )  # fmt: skip
    return {**message.to_openai(), "content": text}


def _clearing(message: Msg) -> ClearingRec:
    """A clearing that reclaims exactly the difference to the placeholder, as the store does."""
    reclaimed = message.tokens - tokens.count_message(_placeholder(message), ENCODING)
    return ClearingRec(message_id=message.id, reason="idle", tokens_reclaimed=reclaimed)


def _count_summary(text: str, cutoff: int) -> int:
    message = {"role": "user", "content": SUMMARY_MESSAGE_PREFIX + text + summary_note(cutoff)}
    return tokens.count_message(message, ENCODING)


def _assemble(case: dict[str, Any]) -> AssembledRequest:
    return assemble(case["branch"], model=MODEL, **{k: v for k, v in case.items() if k != "branch"})


def _sent_ids(
    request: AssembledRequest, branch: list[Msg], clearings: dict[int, ClearingRec]
) -> list[int]:
    """The stored messages a request sends, traced by their tags (a cleared result by its call
    id, which the placeholder keeps), in the order sent."""
    by_tag = {f"m{m.id}": m.id for m in branch}
    cleared = [m for m in branch if m.id in clearings]
    sent: list[int] = []
    for message in request.messages:
        content = message.get("content")
        first = content.split(" ", 1)[0] if isinstance(content, str) and content else None
        if first in by_tag:
            sent.append(by_tag[first])
        elif message.get("tool_calls"):
            sent.append(by_tag[message["tool_calls"][0]["function"]["arguments"]])
        elif first == "[Cleared:":  # the placeholder names the stored call id
            call_id = content.split("(call ", 1)[1].split(",", 1)[0]
            unsent = (m.id for m in cleared if m.tool_call_id == call_id and m.id not in sent)
            sent.append(next(unsent))
    return sent


@pytest.mark.parametrize("block", range(10))
def test_random_branches_keep_every_promise(block: int) -> None:
    """A hundred seeded cases a block: a valid, exact, contiguous, deterministic request, or a
    budget error; nothing lost without being reported."""
    errors = 0
    for seed in range(block * CASES // 10, (block + 1) * CASES // 10):
        case = random_case(seed)
        try:
            request = _assemble(case)
        except BudgetError as exc:
            assert "compress the conversation or allow a larger window" in str(exc)
            errors += 1
            continue
        context = f"seed {seed}"
        check_request(request)
        recount = tokens.count_messages(request.messages, ENCODING)
        assert request.tokens.total == recount, context
        assert request.messages[-1]["content"] == case["reminder"] or not case["reminder"]
        assert json.dumps(_assemble(case).as_dict()) == json.dumps(request.as_dict()), context
        _check_accounting(case, request, context)
    assert errors < CASES // 10, "most random cases should fit one of the larger windows"


def _check_accounting(case: dict[str, Any], request: AssembledRequest, context: str) -> None:
    """Every stored message after the cutoff is sent or reported dropped, never both; the sent
    ones are a contiguous newest run, in stored order but for results sent right after their
    call (the stored system prompt aside)."""
    branch: list[Msg] = case["branch"]
    summary: SummaryRec | None = case["summary"]
    root = branch[0] if branch[0].role == "system" else None
    after = [m.id for m in branch if m is not root]
    if summary is not None:
        position = next(i for i, m in enumerate(branch) if m.id == summary.cutoff_message_id)
        after = [m.id for m in branch[position + 1 :] if m is not root]
    traced = _sent_ids(request, branch, case["clearings"])
    sent = [mid for mid in traced if root is None or mid != root.id]
    dropped = set(request.dropped_message_ids)
    assert not dropped & set(sent), context
    assert set(after) <= dropped | set(sent), context
    roles = {m.id: m.role for m in branch}
    heads = [mid for mid in sent if roles[mid] != "tool"]  # a result moves up to its call
    assert heads == sorted(heads), context
    if sent:
        kept_from = after.index(sent[0])
        assert all(mid in sent or mid in dropped for mid in after[kept_from:]), context
        assert set(after[:kept_from]) <= dropped, context
