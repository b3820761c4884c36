"""Compression planning as tables of plain values: the split, the summarizer's input,
chunking and the validation of a summary."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from recap.core.counting import tokens
from recap.core.summaries import planning
from recap.core.summaries.planning import (
    build_summary_messages,
    plan_split,
    plan_summary,
    rejection_reason,
    render_message,
)
from recap.core.summaries.prompts import CUTOFF_MARKER, DEFAULT_SUMMARY_PROMPT, NO_PREVIOUS_SUMMARY
from recap.core.values.records import ClearingRec, Msg, SummaryRec

KNOBS: dict[str, Any] = dict(
    safety_margin=0.05,
    trigger_ratio=0.75,
    recent_ratio=0.2,
    recent_min_tokens=2_000,
    recent_max_tokens=8_000,
    keep_turns=0,
)


def msg(i: int, role: str, size: int, **extra: Any) -> Msg:
    return Msg(
        id=i, parent_id=i - 1 if i > 1 else None, role=role, content=f"m{i}", tokens=size, **extra
    )


def call(i: int, size: int, *ids: str) -> Msg:
    calls = tuple(
        {"id": c, "type": "function", "function": {"name": "bash", "arguments": "{}"}} for c in ids
    )
    return msg(i, "assistant", size, tool_calls=calls)


def result(i: int, size: int, call_id: str) -> Msg:
    return msg(i, "tool", size, tool_call_id=call_id)


CHAT = [
    msg(1, "system", 100),
    msg(2, "user", 500),
    msg(3, "assistant", 500),
    msg(4, "user", 500),
    msg(5, "assistant", 500),
    msg(6, "user", 500),
    msg(7, "assistant", 500),
]
AGENT = [
    msg(1, "system", 100),
    msg(2, "user", 200),
    call(3, 50, "a"),
    result(4, 3_000, "a"),
    call(5, 50, "b"),
    result(6, 3_000, "b"),
    call(7, 50, "c"),
    result(8, 500, "c"),
    msg(9, "assistant", 100),
]
OPEN_CALL = [
    msg(1, "user", 100),
    call(2, 50, "a", "b"),
    result(3, 900, "a"),
    msg(4, "assistant", 100),
    result(5, 900, "b"),
    msg(6, "assistant", 100),
]

LATE_RESULT = [  # the user spoke again before the tool answered
    msg(1, "user", 100),
    call(2, 50, "x"),
    msg(3, "user", 100),
    result(4, 900, "x"),
    msg(5, "assistant", 100),
]


@pytest.mark.parametrize(
    ("messages", "budget", "cap", "keep", "cutoff", "at_user"),
    [
        (CHAT, 1_000, 1_500, 0, 5, True),  # the earliest user message whose suffix fits
        (CHAT, 2_000, 3_000, 0, 3, True),  # a larger budget keeps more
        (CHAT, 500, 1_500, 0, 5, True),  # nothing fits the budget: the latest within the cap
        (CHAT, 1_000, 1_500, 2, 5, True),  # keep 2 turns needs 2,000 > cap: budget unchanged
        (CHAT, 1_000, 2_500, 2, 3, True),  # keep 2 turns fits the cap: the budget grows
        (AGENT, 1_000, 1_500, 0, 6, False),  # one user turn: cut before an answered step
        (AGENT, 100, 200, 0, 8, False),  # even the last step is too big: cut before it anyway
        (OPEN_CALL, 1_000, 1_000, 0, 5, False),  # never between a call and its last result
        (LATE_RESULT, 1_100, 1_100, 0, 4, False),  # nor before a user message a result follows
        ([msg(1, "system", 10), msg(2, "user", 10)], 1, 1, 0, None, False),  # nothing older
        ([msg(1, "user", 10)], 1, 1, 0, None, False),  # a single message
        ([], 1, 1, 0, None, False),  # nothing at all
    ],
)
def test_split(
    messages: list[Msg], budget: int, cap: int, keep: int, cutoff: int | None, at_user: bool
) -> None:
    """The cut falls just before a user message when one qualifies, else before a whole step."""
    split = plan_split(messages, recent_budget=budget, recent_cap=cap, keep_turns=keep)
    if cutoff is None:
        assert split is None
        return
    assert split is not None
    assert split.cutoff_message_id == cutoff
    assert split.at_user is at_user
    assert list(split.older) + list(split.recent) == messages


def test_split_counts_cleared_results_at_their_placeholder_size() -> None:
    """A cleared result's reclaimed tokens do not count toward the recent budget."""
    cleared = {6: ClearingRec(message_id=6, reason="idle", tokens_reclaimed=2_900)}
    split = plan_split(AGENT, recent_budget=1_000, recent_cap=1_500, clearings=cleared)
    assert split is not None and split.cutoff_message_id == 4


NAMES = {"c1": "bash"}
CALLING = Msg(
    1,
    None,
    "assistant",
    "Let me look.",
    10,
    tool_calls=(
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls -la"}'},
        },
    ),
)


@pytest.mark.parametrize(
    ("message", "cleared", "limit", "role", "expected"),
    [
        (
            CALLING,
            False,
            100,
            "assistant",
            'Let me look.\n[Used tools: bash({"command": "ls -la"})]',
        ),
        (
            Msg(2, 1, "tool", "x" * 50, 5, tool_call_id="c1"),
            False,
            100,
            "user",
            "[Tool result of bash]\n" + "x" * 50,
        ),
        (
            Msg(2, 1, "tool", "secret output", 5, tool_call_id="c1"),
            True,
            100,
            "user",
            "[Tool result of bash]\n(output cleared earlier)",
        ),
        (
            Msg(3, None, "system", "Be brief.", 5),
            False,
            100,
            "user",
            "[System instructions]\nBe brief.",
        ),
        (Msg(4, None, "user", "hello", 5), False, 100, "user", "hello"),
    ],
)
def test_render(message: Msg, cleared: bool, limit: int, role: str, expected: str) -> None:
    """Tool calls as [Used tools: name(args)], results under their tool's name, no tool roles."""
    rendered = render_message(message, names=NAMES, result_chars=limit, cleared=cleared)
    assert rendered == {"role": role, "content": expected}


@pytest.mark.parametrize("size", [10_000, 100_000])
def test_render_trims_long_results(size: int) -> None:
    """A long tool result keeps its head and tail and says how much was cut."""
    text = "head " + "y" * size + " tail"
    rendered = render_message(
        Msg(2, 1, "tool", text, 5, tool_call_id="c1"), names=NAMES, result_chars=2_000
    )
    content = rendered["content"]
    assert len(content) < 2_200 and "head" in content and "tail" in content
    assert "characters trimmed" in content


@pytest.mark.parametrize(
    ("previous", "recent", "missing"),
    [(None, [], []), ("old summary", [{"role": "user", "content": "now"}], ["a.py", "b.py"])],
)
def test_summary_messages_order(
    previous: str | None, recent: list[dict[str, str]], missing: list[str]
) -> None:
    """System (with the previous summary), older, the marker alone, recent, the reminder last."""
    older = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "reply"}]
    messages = build_summary_messages(
        prompt=DEFAULT_SUMMARY_PROMPT,
        previous_summary=previous,
        older=older,
        recent=recent,
        missing=missing,
    )
    assert messages[0]["role"] == "system"
    assert (previous or NO_PREVIOUS_SUMMARY) in messages[0]["content"]
    assert "{previous_summary}" not in messages[0]["content"]
    assert messages[1:3] == older
    assert messages[3] == {"role": "user", "content": CUTOFF_MARKER}
    assert messages[4:-1] == recent
    assert messages[-1]["role"] == "user"
    assert all(f"- {m}" in messages[-1]["content"] for m in missing)


def test_prompt_without_placeholder_is_rejected() -> None:
    """A summary prompt that cannot carry the previous summary is an error."""
    with pytest.raises(ValueError, match="previous_summary"):
        planning.system_prompt("Summarize.", "old")


def count(message: Any) -> int:
    return tokens.count_message(message, tokens.O200K)


def words(n: int, role: str = "user") -> dict[str, str]:
    """A message of about ``n`` tokens."""
    return {"role": role, "content": "x" + " x" * (n - 1)}


@pytest.mark.parametrize(
    ("older_sizes", "window", "chunks"),
    [
        ([500] * 4, 16_000, 1),  # everything fits one request
        ([500] * 40, 16_000, 3),  # 20k tokens of older messages in ~9k of room: three chunks
        ([30_000], 16_000, 1),  # one huge message is cut to fit, not split
    ],
)
def test_plan_summary_chunks(older_sizes: list[int], window: int, chunks: int) -> None:
    """The summarizer's input fits its window: one request, or chunks that each fit."""
    older = [words(n) for n in older_sizes]
    plan = plan_summary(
        older=older,
        recent=[words(3_000), words(1_000)],
        prompt=DEFAULT_SUMMARY_PROMPT,
        previous_summary_tokens=500,
        window=window,
        max_output_tokens=2_000,
        count=count,
    )
    assert len(plan.chunks) == chunks
    for chunk in plan.chunks:
        request = build_summary_messages(
            prompt=DEFAULT_SUMMARY_PROMPT,
            previous_summary="s " * 2_000,
            older=chunk,
            recent=plan.recent,
        )
        assert tokens.count_messages(request, tokens.O200K) <= plan.input_budget
    assert sum(count(m) for m in plan.recent) <= plan.input_budget * 0.25
    assert plan.recent == (words(1_000),)  # the newest context that fits a quarter of the input


def test_plan_summary_needs_room() -> None:
    """A summarizer window too small for its own prompt and output is a clear error."""
    with pytest.raises(planning.SummarizerWindowError, match="cannot hold"):
        plan_summary(
            older=[words(100)],
            recent=[],
            prompt=DEFAULT_SUMMARY_PROMPT,
            previous_summary_tokens=0,
            window=2_000,
            max_output_tokens=1_500,
            count=count,
        )


@pytest.mark.parametrize(
    ("text", "size", "replaced", "fragment"),
    [
        ("## Goal\n- ship it", 10, 1_000, None),
        ("", 0, 1_000, "empty"),
        ("   \n ", 1, 1_000, "empty"),
        (None, 0, 1_000, "empty"),
        ("Error: rate limit exceeded", 5, 1_000, "error"),
        ("I'm sorry, I can't help with that.", 9, 1_000, "error"),
        ("<html><body>502 Bad Gateway</body></html>", 12, 1_000, "error"),
        ("## Goal\n- a long summary", 1_000, 1_000, "does not reduce"),
    ],
)
def test_rejection(text: str | None, size: int, replaced: int, fragment: str | None) -> None:
    """Empty text, error text, or no saving is rejected; a real summary is not."""
    reason = rejection_reason(text, summary_tokens=size, replaced_tokens=replaced)
    if fragment is None:
        assert reason is None
    else:
        assert reason is not None and fragment in reason


SUMMARY_AT_3 = SummaryRec(id=1, cutoff_message_id=3, previous_summary_id=None, text="s", tokens=40)


@pytest.mark.parametrize(
    ("summary", "cleared", "pending", "history"),
    [
        (None, {}, [2, 3, 4, 5, 6, 7], 3_100),  # the root system prompt is never pending
        (SUMMARY_AT_3, {}, [4, 5, 6, 7], 100 + 40 + 2_000),  # the root is still sent
        (
            SUMMARY_AT_3,
            {5: ClearingRec(message_id=5, reason="idle", tokens_reclaimed=400)},
            [4, 5, 6, 7],
            100 + 40 + 1_600,
        ),
    ],
)
def test_pending_and_request_tokens(
    summary: SummaryRec | None, cleared: dict[int, ClearingRec], pending: list[int], history: int
) -> None:
    """Pending messages follow the summary's cutoff; the request counts root, summary and rest."""
    assert [m.id for m in planning.pending_messages(CHAT, summary)] == pending
    assert planning.request_history_tokens(CHAT, summary, cleared) == history


# --- the summarizer's cooldown after repeated failures -----------------------------------------

_T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _ago(*minutes: float) -> list[datetime]:
    return [_T0 - timedelta(minutes=m) for m in minutes]


@pytest.mark.parametrize(
    ("failures", "streak", "expected_minutes_after_newest"),
    [
        ([], 3, None),  # no failure: run
        (_ago(1, 2), 3, None),  # under the streak: run
        (_ago(1, 2, 3), 3, 10),  # the streak reached: rest the first cooldown
        (_ago(1, 2, 3, 4), 3, 20),  # each further failure doubles it
        (_ago(1, 2, 3, 4, 5, 6), 3, 80),
        (_ago(*range(1, 30)), 3, 160),  # at most COOLDOWN_MAX_FACTOR times the first
        (_ago(5), 1, 10),  # a streak of one rests after any failure
    ],
)
def test_cooldown_until(
    failures: list[datetime], streak: int, expected_minutes_after_newest: float | None
) -> None:
    """A run of failures rests the summarizer, longer with each further failure, capped."""
    until = planning.cooldown_until(failures, streak=streak, first_minutes=10)
    if expected_minutes_after_newest is None:
        assert until is None
    else:
        assert until == failures[0] + timedelta(minutes=expected_minutes_after_newest)


def _random_pending(rng: random.Random) -> list[Msg]:
    """Unsummarized messages as agents and chats leave them: turns, steps with parallel calls,
    results in any order, some calls never answered, a system message now and then."""
    out: list[Msg] = []
    open_calls: list[str] = []
    for mid in range(1, rng.randint(1, 60) + 1):
        roll = rng.random()
        size = rng.randint(5, 400)
        if open_calls and roll < 0.45:
            out.append(result(mid, size, open_calls.pop(rng.randrange(len(open_calls)))))
        elif roll < 0.6:
            ids = [f"c{mid}_{k}" for k in range(rng.randint(1, 3))]
            open_calls.extend(ids)
            out.append(call(mid, size, *ids))
        elif roll < 0.8:
            out.append(msg(mid, "user", size))
        elif roll < 0.95:
            out.append(msg(mid, "assistant", size))
        else:
            out.append(msg(mid, "system", size))
    return out


@pytest.mark.parametrize("block", range(5))
def test_random_splits_never_cut_a_pair_and_keep_the_recent_budget(block: int) -> None:
    """On seeded random histories the split is a partition with a substantive older part; the
    recent part starts at a user message, or at an assistant step no call is open across; and
    when some user message's suffix fits the budget, the recent part is the largest that does."""
    for seed in range(block * 200, (block + 1) * 200):
        rng = random.Random(seed)
        messages = _random_pending(rng)
        budget = rng.choice([50, 300, 1_000, 5_000])
        cap = budget * rng.choice([1, 2, 4])
        split = plan_split(messages, recent_budget=budget, recent_cap=cap)
        if split is None:
            continue
        older, recent = list(split.older), list(split.recent)
        assert older and recent and older + recent == messages, seed
        assert any(m.role not in ("system", "developer") for m in older), seed
        first = recent[0]
        assert first.role == ("user" if split.at_user else "assistant"), seed
        pairs = _pairs(messages)
        assert not any(c < len(older) <= r for c, r in pairs), seed  # no pair across the cut
        if not split.at_user:
            last_user = max((i for i, m in enumerate(older) if m.role == "user"), default=0)
            made = {c for m in older[last_user:] for c in m.tool_call_ids}
            answered_later = {m.tool_call_id for m in recent if m.role == "tool"}
            assert not made & answered_later, seed
        sizes = [m.tokens for m in messages]
        starts = [
            i
            for i, m in enumerate(messages)
            if m.role == "user" and _has_substance(messages[:i])
            and not any(c < i <= r for c, r in pairs)
        ]  # fmt: skip
        fitting = [i for i in starts if sum(sizes[i:]) <= budget]
        if fitting:
            assert len(older) == min(fitting), seed


def _has_substance(messages: list[Msg]) -> bool:
    return any(m.role not in ("system", "developer") for m in messages)


def _pairs(messages: list[Msg]) -> list[tuple[int, int]]:
    """(call index, result index) of each call answered later: the first result with its id."""
    out = []
    for c, message in enumerate(messages):
        for call_id in message.tool_call_ids if message.role == "assistant" else ():
            later = (r for r in range(c + 1, len(messages)) if messages[r].tool_call_id == call_id)
            r = next(later, None)
            if r is not None:
                out.append((c, r))
    return out
