"""Every door keeps every promise, in request assembly: a screenshot is sent in its own turn,
several results of the newest step that do not fit share the room (one common cut, none
dropped), and a replay leaves no history out that the run before it chose not to cover."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from recap.core.counting import media
from recap.core.request import shorten
from recap.core.request.assembly.tail import fit_tail
from recap.core.values.draft import Unit
from recap.core.values.records import Msg
from tests.support.assembling import assemble
from tests.test_media import _branch, data_url, image_part, png_bytes

# --- 4. the media of the current user message -------------------------------------------------


def _screens(model: str, older: int) -> list[Msg]:
    """``older`` screenshot turns, then the current user message with a 1280x800 screenshot."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You read screenshots."}]
    for n in range(older + 1):
        part = image_part(data_url(png_bytes(1280, 800, seed=n)))
        text = {"type": "text", "text": f"What changed in {n}?"}
        messages.append({"role": "user", "content": [text, part]})
        if n < older:
            messages.append({"role": "assistant", "content": f"Step {n}: the dialog moved."})
    return _branch(messages, model)


def _images(request: Any) -> list[int]:
    """The positions of the user messages sent with an image in full."""
    users = [m for m in request.messages if m["role"] == "user"]
    return [
        n
        for n, m in enumerate(users)
        if isinstance(m["content"], list) and any(p["type"] == "image_url" for p in m["content"])
    ]


@pytest.mark.parametrize(
    ("model", "older", "window", "max_tokens", "shown"),
    [
        ("gpt-4o-mini", 0, 128_000, 16_000, [0]),  # 36,835 > the cap: still sent in its turn
        ("gpt-4o-mini", 2, 128_000, 16_000, [2]),  # the cap ages the older ones
        ("gpt-4o-mini", 1, 128_000, 80_000, [0, 1]),  # room under the cap: both kept
        ("gpt-4o-mini", 1, 128_000, 40_000, [1]),  # the current one counts against the cap
        ("gpt-4o-mini", 0, 128_000, 0, [0]),  # a cap of 0 is for older media only
        ("gpt-4o", 2, 128_000, 16_000, [0, 1, 2]),  # 1,105 each: all within the cap
        ("gpt-4o-mini", 0, 30_000, 16_000, []),  # the window cannot hold it: a placeholder
    ],
)
def test_the_current_screenshot_is_sent_in_its_own_turn(
    model: str, older: int, window: int, max_tokens: int, shown: list[int]
) -> None:
    """The media of the last user message is sent whenever the window can hold it; the caps
    (RECAP_MAX_MEDIA_TOKENS) age older media only; the request stays within its budget."""
    policy = media.MediaPolicy(keep_turns=10, max_tokens=max_tokens)
    request = assemble(
        _screens(model, older), model=model, window=window, safety_margin=0.05,
        media_policy=policy,
    )  # fmt: skip
    assert _images(request) == shown
    assert request.tokens.total <= request.budget
    if older == 0 and not shown:
        assert "removed" in json.dumps(request.messages)


def test_a_screenshot_sent_through_recap_is_sent_in_its_own_turn(tmp_path: Any) -> None:
    """The reproduced case, with the default settings (RECAP_MAX_MEDIA_TOKENS 16,000): a
    1280x800 screenshot sent to gpt-4o-mini with the current user message, at a 128k window."""
    from recap.core.client import Recap
    from recap.core.settings import Settings

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'f.db'}", output_dir=tmp_path / "o")
    recap = Recap(settings, create_schema=True)
    cid = recap.new(model="gpt-4o-mini", max_input_tokens=128_000)
    text = {"type": "text", "text": "what is on the screen?"}
    recap.add(cid, {"role": "user", "content": [text, image_part(data_url(png_bytes(1280, 800)))]})
    request = recap.assemble(cid)
    assert request.tokens.media == 36_835 > settings.max_media_tokens
    assert "removed" not in json.dumps(request.messages) and not request.media_aged
    assert request.tokens.total <= request.budget


# --- 3. the results of the newest step share the room -------------------------------------------


def _turn(steps: list[list[int]], user_tokens: int = 12) -> list[Unit]:
    """A tail: the user message, then one unit per step: an assistant message with one call per
    size and the results of those token sizes (the unit's tokens are its messages' sum)."""
    user = Msg(1, None, "user", "go", user_tokens)
    units = [Unit((user,), (user.id,), user.tokens, True)]
    next_id = 2
    for sizes in steps:
        calls = tuple({"id": f"c{next_id}-{n}", "type": "function"} for n in range(len(sizes)))
        call = Msg(next_id, next_id - 1, "assistant", "", 8 + 12 * len(sizes), calls)
        results = tuple(
            Msg(next_id + 1 + n, next_id, "tool", "x", size, (), f"c{next_id}-{n}")
            for n, size in enumerate(sizes)
        )
        step = (call, *results)
        units.append(Unit(step, tuple(m.id for m in step), sum(m.tokens for m in step), False))
        next_id += 1 + len(sizes)
    return units


def _common_cut_fits(tail: list[Unit], room: int) -> bool:
    """The reference: every result cut to the smallest size a shortened result takes (or left
    whole when smaller) and every other message whole fits ``room``."""
    total = 0
    for unit in tail:
        for item in unit.items:
            assert isinstance(item, Msg)
            small = item.role == "tool"
            total += min(item.tokens, shorten.MIN_KEPT_TOKENS) if small else item.tokens
    return total <= room


def _check_fit(tail: list[Unit], room: int) -> None:
    """fit_tail against the reference: within the room whenever a common cut fits, every result
    and every step kept then (each call with its result), all cut results at one size."""
    fit = fit_tail(tail, room, {}, "o200k_base")
    sent = [mid for unit in fit.tail for mid in unit.ids]
    results = [m.id for unit in tail for m in unit.items if isinstance(m, Msg) and m.role == "tool"]
    for unit in fit.tail:  # a step is sent whole: its call with all its results
        assert unit in tail or any(unit.ids == whole.ids for whole in tail) or not unit.ids
    if _common_cut_fits(tail, room):
        assert sum(unit.tokens for unit in fit.tail) <= room
        assert not fit.cut_steps and not fit.older
        assert all(mid in sent for mid in results)
        sizes = {
            m.tokens - fit.clearings[m.id].tokens_reclaimed
            for unit in tail
            for m in unit.items
            if isinstance(m, Msg) and m.id in fit.clearings
        }
        assert len(sizes) <= 2  # one common size (the half-room cap when nothing more was cut)
        if len(sizes) == 2:
            assert max(sizes) == max(room // 2, shorten.MIN_KEPT_TOKENS)


@pytest.mark.parametrize(
    ("steps", "room"),
    [
        ([[4_700]] * 13, 2_800),  # 13 steps of one large result each: all cut, none dropped
        ([[4_700] * 13], 2_800),  # one step with 13 results
        ([[900, 150, 4_000], [60], [2_500, 2_500]], 1_500),  # mixed sizes: the largest cut
        ([[150]] * 30, 2_800),  # too many steps for the smallest cut: the oldest left out
        ([[4_700]] * 3, 200),  # the room holds no cut: the user message alone
    ],
)
def test_the_results_of_the_turn_share_the_room(steps: list[list[int]], room: int) -> None:
    """Results that do not fit are cut to one common size, so every step is kept, rather than
    the oldest steps left out; steps are left out only when even the smallest cut cannot fit."""
    tail = _turn(steps)
    _check_fit(tail, room)
    fit = fit_tail(tail, room, {}, "o200k_base")
    assert bool(fit.cut_steps) == (not _common_cut_fits(tail, room))


def test_the_results_of_the_turn_share_the_room_seeded() -> None:
    """Random turns (steps, results per step, sizes, room) against the reference."""
    rng = random.Random(37)
    for _ in range(400):
        steps = [
            [rng.choice([20, 90, 300, 1_200, 5_000]) + rng.randrange(50) for _ in range(k)]
            for k in (rng.randint(1, 6) for _ in range(rng.randint(1, 14)))
        ]
        room = rng.randint(100, 12_000)
        _check_fit(_turn(steps), room)


def test_thirteen_long_results_are_cut_not_dropped(tmp_path: Any) -> None:
    """The reproduced case: 13 tool results of 600 lines each after one user message at a
    3,000 window. Every result is sent, each cut to its head and tail, every call paired with
    its result, and the request fills its room."""
    from recap.core.client import Recap
    from recap.core.settings import Settings

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'f.db'}", output_dir=tmp_path / "o")
    recap = Recap(settings, create_schema=True)
    for parallel in (False, True):
        cid = recap.new(model="gpt-4o", max_input_tokens=3_000)
        recap.add(cid, {"role": "user", "content": "read them all"})
        calls = [
            {"id": f"c{i}", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
            for i in range(13)
        ]
        if parallel:
            recap.add(cid, {"role": "assistant", "content": "", "tool_calls": calls})
        for i in range(13):
            if not parallel:
                recap.add(cid, {"role": "assistant", "content": "", "tool_calls": [calls[i]]})
            lines = "\n".join(f"file{i} line {j} some text here" for j in range(600))
            recap.add(cid, {"role": "tool", "tool_call_id": f"c{i}", "content": lines})
        request = recap.assemble(cid)
        assert not request.dropped_message_ids and not request.truncated
        assert request.budget * 0.9 <= request.tokens.total <= request.budget
        results = [m for m in request.messages if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in results] == [f"c{i}" for i in range(13)]
        assert all("left out here to fit the context window" in m["content"] for m in results)
        assert all(m["content"].startswith(f"file{i} line 0") for i, m in enumerate(results))


# --- 2. no silent truncation in a replay --------------------------------------------------------


@pytest.mark.parametrize("window", [3_500, 4_000, 6_000])
def test_the_shared_agent_runs_are_never_silently_truncated(window: int) -> None:
    """`recap replay` of the shared SWE-agent runs with the host's fixed parts: no request leaves
    history out after a run that decided there was nothing to do."""
    from recap.core.settings import load_settings
    from recap.workers import replay
    from tests.support.data import load_data

    records = load_data("swe_agent.jsonl")
    report = replay.replay_records(records, load_settings(summary_model=None), window=window)
    total = report["total"]
    assert total["silent_truncations"] == 0, [
        c["id"] for c in report["conversations"] if c["silent_truncations"]
    ]
    assert total["errors"] == 0 and total["over_window"] == 0


@pytest.mark.parametrize(
    ("turns", "size", "window", "action"),
    [
        (14, 200, 5_000, "summarize"),  # over the room, the span under the minimum: summarized
        (6, 200, 2_400, "summarize"),  # a small span, but leaving it out would drop it
        (40, 100, 10_000, "skip"),  # under the room: the minimum span still holds
    ],
)
def test_over_the_room_a_span_under_the_minimum_is_summarized(
    turns: int, size: int, window: int, action: str
) -> None:
    """When the history no longer fits the room, a span below the smallest worth summarizing is
    summarized all the same: otherwise the next request leaves it out with nothing covering it
    (a silent truncation). Under the room the minimum holds."""
    from recap.core.decision import policy
    from tests.test_policy import chat, snap

    knobs = policy.Knobs(keep_turns=2, recent_min_tokens=200, min_summary_span_tokens=10**6)
    decision = policy.decide(snap(chat(turns, size=size), window=window), knobs)
    assert (decision.pressure.ratio > 1) == (action == "summarize")
    assert decision.action == action, decision.reason
