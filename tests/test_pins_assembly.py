"""Pinned messages in the request view, as a pure function: tables of small branches with pins
across summaries, clearings, the budget and the tail fitter, then a thousand seeded random
branches on which no pinned message is ever lost, whatever is summarized, cleared or left out."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from recap.core.counting import tokens
from recap.core.errors import BudgetError
from recap.core.request import pins as pin_rules
from recap.core.request.assembly import REASONING_CLEARING, AssembledRequest
from recap.core.request.render import text_only_call, text_only_results
from recap.core.request.timeline import PINNED, derive
from recap.core.values.records import ClearingRec, Msg, SummaryRec
from tests.support.assembling import assemble
from tests.test_assembly import ENCODING, MODEL, chain, check_request, label, labels
from tests.test_assembly_random import _clearing, _count_summary, random_case

BIG = 100_000


def summary(cutoff: int, text: str = "the story so far") -> SummaryRec:
    """A summary counted as the request sends it (so that totals can be recounted)."""
    return SummaryRec(
        id=7,
        cutoff_message_id=cutoff,
        previous_summary_id=None,
        text=text,
        tokens=_count_summary(text, cutoff),
    )


def pinned_of(branch: list[Msg], *ids: int) -> list[Msg]:
    return [m for m in branch if m.id in ids]


def build(branch: list[Msg], pins: tuple[int, ...] = (), **knobs: Any) -> AssembledRequest:
    knobs.setdefault("window", BIG)
    knobs.setdefault("safety_margin", 0.0)
    knobs.setdefault("model", MODEL)
    request = assemble(branch, pinned=pinned_of(branch, *pins), **knobs)
    check_request(request)
    recount = tokens.count_messages(request.messages, ENCODING)
    if request.shortened:  # a shortened result is counted at the size it was cut to
        assert request.tokens.total >= recount
    else:
        assert request.tokens.total == recount
    return request


AGENT = ["S:stored", "U:u1", "C:x", "T:x:out-x", "A:a1", "U:u2", "C:y", "T:y:out-y", "A:a2"]


@pytest.mark.parametrize(
    ("specs", "pins", "knobs", "expected"),
    [
        (["S:stored", "U:u1", "A:a1", "U:u2"], (2,), {}, ["stored", "u1", "a1", "u2"]),
        (
            ["S:stored", "U:u1", "A:a1", "U:u2"],
            (2,),
            {"summary": summary(3)},
            ["stored", "summary", "u1", "u2"],
        ),
        (
            ["S:stored", "U:u1", "A:a1", "U:u2", "A:a2", "U:u3"],
            (4, 2),
            {"summary": summary(5)},
            ["stored", "summary", "u1", "u2", "u3"],
        ),
        (
            AGENT,
            (4,),
            {"summary": summary(5)},
            ["stored", "summary", "[Tool result x (bash)]\nout-x", "u2", "call:y", "out-y", "a2"],
        ),
        (
            AGENT,
            (3,),
            {"summary": summary(5)},
            ["stored", "summary", "[Tool call x: bash {}]", "u2", "call:y", "out-y", "a2"],
        ),
        (
            AGENT,
            (1,),
            {"summary": summary(5)},
            ["stored", "summary", "u2", "call:y", "out-y", "a2"],
        ),
        (
            ["U:u1", "A:a1", "U:u2", "A:a2", "U:u3"],
            (1, 4),
            {"summary": summary(4)},
            ["summary", "u1", "a2", "u3"],
        ),
    ],
    ids=[
        "in-place",
        "after-the-summary",
        "several-in-branch-order",
        "a-result-as-text",
        "a-call-as-text",
        "the-stored-prompt-once",
        "the-cutoff-itself",
    ],
)
def test_where_a_pinned_message_is_sent(
    specs: list[str], pins: tuple[int, ...], knobs: dict[str, Any], expected: list[str]
) -> None:
    assert labels(build(chain(*specs), pins, **knobs)) == expected


def test_a_pin_overrides_a_clearing_and_unpinning_restores_it() -> None:
    branch = chain(*AGENT)
    clearings = {4: _clearing(branch[3]), 8: _clearing(branch[7])}
    plain = build(branch, clearings=clearings)
    assert labels(plain)[3] == "cleared"
    held = build(branch, (4,), clearings=clearings)
    assert labels(held)[3] == "out-x"  # as stored, not its placeholder
    assert labels(held)[7] == "cleared"  # the unpinned one still is
    assert build(branch, (), clearings=clearings).messages == plain.messages
    # the record that an old turn's thinking is not sent stays whatever is pinned
    reasoning = {5: ClearingRec(message_id=5, reason=REASONING_CLEARING, tokens_reclaimed=0)}
    assert pin_rules.effective_clearings(reasoning, {5}) == reasoning


def test_a_pinned_message_stays_when_older_history_is_left_out() -> None:
    specs = ["S:stored", "U:pin me", "A:@400", "U:@400", "A:@400", "U:u-last"]
    branch = chain(*specs)
    tight = build(branch, window=300)
    assert 2 in tight.dropped_message_ids
    held = build(branch, (2,), window=300)
    names = labels(held)
    assert names[:3] == ["stored", "gap", "pin me"] and names[-1] == "u-last"
    assert 2 not in held.dropped_message_ids and held.truncated
    assert held.truncated_tokens == sum(m.tokens for m in branch if m.id in (3, 4, 5))


def test_a_pinned_result_in_the_tail_is_never_shortened() -> None:
    big = "x " * 600
    specs = ["U:go", "C:a", f"T:a:{big}", "C:b", f"T:b:{big}", "A:done"]
    branch = chain(*specs)
    squeezed = build(branch, window=900)
    assert squeezed.shortened  # both results do not fit whole
    held = build(branch, (3,), window=1_000)
    sent = {m.get("tool_call_id"): m["content"] for m in held.messages if m["role"] == "tool"}
    assert sent["a"] == big
    assert 3 not in {mid for mid, _ in held.shortened}


def test_a_pinned_step_of_the_turn_is_kept_when_other_steps_are_left_out() -> None:
    big = "y " * 500
    # ten large steps: too many for even the smallest common cut, so steps are left out
    many = [spec for n in "bcdefghijk" for spec in (f"C:{n}", f"T:{n}:{big}")]
    specs = ["U:go", "C:a", "T:a:keep me", *many, "A:done"]
    branch = chain(*specs)
    plain = build(branch, window=1_000)
    assert 3 in plain.dropped_message_ids
    held = build(branch, (3,), window=1_000)
    assert "keep me" in labels(held) and 3 not in held.dropped_message_ids


def test_pinned_tokens_are_fixed_and_too_many_is_a_budget_error() -> None:
    branch = chain("S:stored", "U:" + "word " * 400, "A:a1", "U:u2")
    assert labels(build(branch, summary=summary(3)))[-1] == "u2"
    with pytest.raises(BudgetError, match="pinned messages"):
        build(branch, (2,), summary=summary(3), window=200)


def test_the_stable_prefix_mark_covers_the_pinned_messages() -> None:
    branch = chain("S:stored", "U:u1", "A:a1", "U:u2", "A:a2", "U:u3")
    request = build(branch, (2,), summary=summary(3), cache_breakpoints=True)
    marked = [i for i, m in enumerate(request.messages) if isinstance(m["content"], list)]
    assert marked[:2] == [0, 2]  # the system prompt, then the pinned message after the summary


def test_a_text_only_request_sends_the_pins_too() -> None:
    branch = chain(*AGENT)
    request = build(branch, (4, 7), summary=summary(5), text_only=True)
    text = "\n".join(str(m["content"]) for m in request.messages)
    assert "out-x" in text and "out-y" in text
    roles = [m["role"] for m in request.messages[1:]]
    assert all(a != b for a, b in itertools.pairwise(roles))  # alternating


def test_block_renders_calls_and_results_as_their_text_only_form() -> None:
    branch = chain(*AGENT)
    call, result = branch[2], branch[3]
    assert pin_rules.block_message(call, "openai", text_only=False) == text_only_call(
        call.to_openai()
    )
    assert pin_rules.block_message(result, "openai", text_only=False) == text_only_results(
        [result.to_openai()]
    )
    assert pin_rules.block_message(branch[1], "openai", text_only=False) == branch[1].to_openai()


def test_the_timeline_says_pinned() -> None:
    branch = chain(*AGENT)
    request = build(branch, (4,), summary=summary(5))
    line = derive(branch, request, summaries=[summary(5)], pinned={4})
    states = {m.id: m.state for m in line.messages}
    assert states[4] == PINNED and states[2] == "summarized" and states[1] == "full"


# --- seeded random branches ------------------------------------------------------------------

CASES = 1_000


def _traces(message: Msg) -> list[str]:
    """What of a pinned message the request must carry, as text: its tag (every random message
    starts with ``m<id>``), or its calls' arguments (which carry the tag)."""
    if message.role == "assistant" and message.tool_calls:
        return [str(c["function"]["arguments"]) for c in message.tool_calls]
    return [str(message.content)]


def _sent_text(request: AssembledRequest) -> str:
    parts = []
    for message in request.messages:
        parts.append(tokens.content_text(message.get("content")))
        for call in message.get("tool_calls") or ():
            parts.append(str(call["function"]["arguments"]))
    return "\n".join(parts)


@pytest.mark.parametrize("block", range(10))
def test_random_branches_never_lose_a_pinned_message(block: int) -> None:
    """A hundred seeded cases a block: random branches, clearings, summaries and windows with a
    random set of pinned messages. Each request is valid and exact, sends every pinned message
    verbatim and never reports one dropped, and is byte-stable; or it is a budget error."""
    errors = 0
    for seed in range(block * CASES // 10, (block + 1) * CASES // 10):
        case = random_case(seed)
        rng = random.Random(f"pins-{seed}")
        branch: list[Msg] = case["branch"]
        candidates = [m for m in branch if m.parent_id is not None or m.role != "system"]
        chosen = rng.sample(candidates, k=min(len(candidates), rng.randint(0, 3)))
        pinned = [m for m in branch if m in chosen]
        try:
            request = assemble(branch, model=MODEL, pinned=pinned, **_knobs(case))
        except BudgetError as exc:
            assert "compress the conversation or allow a larger window" in str(exc)
            errors += 1
            continue
        context = f"seed {seed}"
        check_request(request)
        assert request.tokens.total == tokens.count_messages(request.messages, ENCODING), context
        again = assemble(branch, model=MODEL, pinned=pinned, **_knobs(case))
        assert again.messages == request.messages, context
        sent = _sent_text(request)
        for message in pinned:
            assert message.id not in request.dropped_message_ids, context
            for trace in _traces(message):
                assert trace in sent, f"{context}: pinned message {message.id} is not sent"
        shortened = {mid for mid, _ in request.shortened}
        assert not shortened & {m.id for m in pinned}, context
        if not pinned:  # with no pin the request is the one assembled without the argument
            plain = assemble(branch, model=MODEL, **_knobs(case))
            assert plain.messages == request.messages, context
    assert errors < CASES // 5, "most random cases should fit one of the larger windows"


def _knobs(case: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in case.items() if k != "branch"}


def test_the_gap_note_comes_before_a_pinned_message() -> None:
    """When history before a pinned unit is left out, the note comes first, then the pin."""
    branch = chain("U:old@300", "A:pinned answer", "U:mid@300", "A:@300", "U:last")
    request = build(branch, (2,), window=200)
    assert [label(m) for m in request.messages][:2] == ["gap", "pinned answer"]


# --- media ---------------------------------------------------------------------------------------


def test_pinned_media_is_never_aged_and_ages_last_under_the_byte_guard() -> None:
    """A pinned screenshot older than the last ``keep_turns`` user turns is sent in full and
    counted; when the request's bytes are over the guard, the other images age first."""
    from recap.core.counting import media
    from tests.test_media import _branch, screenshot_turns

    branch = _branch(screenshot_turns(3, pad=100_000))
    first = branch[1]  # the oldest screenshot's user message
    keep_one = media.MediaPolicy(keep_turns=1)
    knobs: dict[str, Any] = {"model": "gpt-4o", "window": 128_000, "safety_margin": 0.05}
    plain = assemble(branch, media_policy=keep_one, **knobs)
    held = assemble(branch, media_policy=keep_one, pinned=[first], **knobs)
    kinds = [[p["type"] for p in m["content"]] for m in held.messages[1::2]]
    assert kinds[0] == ["text", "image_url"] and kinds[1] == ["text", "text"]
    assert held.tokens.media == plain.tokens.media + 1105
    assert first.id not in {mid for mid, _ in held.media_aged}
    roomy = assemble(branch, media_policy=media.MediaPolicy(keep_turns=3), **knobs)
    size = media.request_bytes(roomy.messages)
    tight = media.MediaPolicy(keep_turns=3, max_request_bytes=size - 1000)
    guarded = assemble(branch, media_policy=tight, pinned=[first], **knobs)
    kinds = [[p["type"] for p in m["content"]] for m in guarded.messages[1::2]]
    assert kinds == [["text", "image_url"], ["text", "text"], ["text", "image_url"]]
