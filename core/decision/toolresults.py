"""The clearing policy for tool results (pure).

Clearing is a one-way state recorded beside a message: the request shows a fixed placeholder
instead of the output. Before that a result can be aged: sent as its head and tail within a
character cap (``core.request.shorten.aged_text``), the size it renders within fixed by the row
(``aged_tokens_bound``); an assistant message's old call arguments can be shortened
(``shortened_call``). ``plan_clearings`` decides which results of a branch to take one step
(full -> aged -> cleared, or full -> cleared) and which arguments to shorten, as a
``core.values.clearing.ClearingPlan``; the ``clearings`` rows (one per message and stage) are
written by ``core.storage.sweep.apply_clearings`` (one conversation) or the batched
``core.storage.sweep`` sweep (every idle conversation at once). The previews made on the way in
live in ``core.request.truncation``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any

from recap.core.counting import tokens
from recap.core.counting.tokens import TOKENS_PER_NAME
from recap.core.request.placeholders import (
    DEFAULT_TOOL_NAME,
    aged_note_frames,
    arguments_note,
    placeholder_frames,
)
from recap.core.request.refs import REF_VALUE_TOKENS, message_ref
from recap.core.request.truncation import trim_arguments
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from recap.core.values.records import AGED, ARGUMENTS, CLEARED, ClearingRec, Msg

# --- clearing ----------------------------------------------------------------------------------

IDLE = "idle"  # the conversation was idle past the provider's cache lifetime
POST_SUMMARY = "post_summary"  # a summary was just written, the cache is invalid anyway
PRESSURE = "pressure"  # over the trigger, and enough would be reclaimed
REASONS = (IDLE, POST_SUMMARY, PRESSURE)
VALUE_SLACK = 1  # a variable part may shift one token boundary of the fixed text around it


@lru_cache(maxsize=1)
def _frame_tokens() -> tuple[int, int]:
    """Tokens of the fixed placeholder text, without and with a saved path (either encoding)."""
    frames = placeholder_frames()
    counts = [
        [tokens.count_text(frame, encoding) for encoding in (tokens.O200K, tokens.CL100K)]
        for frame in frames
    ]
    without_path = max(counts[0])
    with_path = max(max(counts[1]), max(counts[2]))
    return without_path, with_path


def placeholder_base_tokens(has_path: bool) -> int:
    """The constant part of ``placeholder_tokens_bound`` (the SQL sweep uses the same numbers)."""
    without_path, with_path = _frame_tokens()
    frame = with_path if has_path else without_path
    role = max(tokens.count_short("tool", e) for e in (tokens.O200K, tokens.CL100K))
    # four variable parts (tool, call id, size, path), each allowed to shift one boundary, and
    # the recall reference's value (core.request.refs), bounded whatever the message id
    return tokens.TOKENS_PER_MESSAGE + role + frame + 4 * VALUE_SLACK + REF_VALUE_TOKENS


DIGIT_RUN_BOUNDS = (10**3, 10**6, 10**9)  # tiktoken splits digits into runs of three


def digit_tokens(number: int) -> int:
    """Tokens of a non-negative integer's digits (one per run of three digits)."""
    return 1 + sum(number >= bound for bound in DIGIT_RUN_BOUNDS)


def placeholder_tokens_bound(
    *, tool_name: str | None, call_id: str, tokens: int, output_path: str | None
) -> int:
    """An upper bound on the tokens of a cleared result's message (its placeholder content, role,
    name and call id), for either encoding, computed without a tokenizer: a token is at least one
    character, so a variable part costs at most its length. ``tokens_reclaimed`` is the stored
    count minus this bound: it never overstates what a clearing saves, and the SQL sweep computes
    the very same number (``core.storage.sweep``)."""
    total = placeholder_base_tokens(output_path is not None)
    total += digit_tokens(tokens) + 2 * len(call_id) + (len(output_path) if output_path else 0)
    if tool_name:  # named in the text and in the message's name field
        total += TOKENS_PER_NAME + 2 * len(tool_name)
    else:
        total += len(DEFAULT_TOOL_NAME)
    return total


def reclaimable(message: Msg) -> int:
    """Tokens clearing this result would save (zero or less: not worth clearing)."""
    bound = placeholder_tokens_bound(
        tool_name=message.name,
        call_id=message.tool_call_id or "",
        tokens=message.tokens,
        output_path=message.output_path,
    )
    return message.tokens - bound


# --- the aged stage ----------------------------------------------------------------------------

AGED_CHARS_PER_TOKEN = 4  # an aged result keeps at most a quarter as many tokens as characters
AGED_HEAD_SHARE = 0.6  # of an aged result, the head; the tail (errors, summaries) gets the rest
AGED_JOIN_SLACK = 4  # tokens the two cuts around the note can add (merges, a split character)
AGED_LEFT_TOKENS = 4  # the number of characters left out, at most (digit runs of up to 10**12)
ARGUMENT_AGED_CHARS = 200  # an old call's long arguments are shortened to about this much
ENCODINGS = (tokens.O200K, tokens.CL100K)


def aged_body_tokens(max_chars: int) -> int:
    """The most tokens an aged result keeps of its output (its head and tail together)."""
    return max(max_chars // AGED_CHARS_PER_TOKEN, 1)


@lru_cache(maxsize=1)
def _aged_frame_tokens() -> tuple[int, int]:
    """Tokens of the aged note's fixed text, without and with a saved path (either encoding)."""
    frames = aged_note_frames()
    counts = [max(tokens.count_text(frame, e) for e in ENCODINGS) for frame in frames]
    return counts[0], max(counts[1], counts[2])


def aged_tokens_bound(message: Msg, max_chars: int) -> int:
    """An upper bound on the tokens of an aged result's message (its head and tail within
    ``max_chars`` characters and ``aged_body_tokens`` tokens, the note, role, name and call id),
    for either encoding, without a tokenizer: what the aged step records (``tokens_reclaimed`` is
    the stored count minus it), and the size ``core.request.shorten.aged_text`` renders within."""
    without_path, with_path = _aged_frame_tokens()
    role = max(tokens.count_short("tool", e) for e in ENCODINGS)
    total = tokens.TOKENS_PER_MESSAGE + role + (with_path if message.output_path else without_path)
    total += 3 * VALUE_SLACK + REF_VALUE_TOKENS + AGED_LEFT_TOKENS + AGED_JOIN_SLACK
    total += 2 * len(message.tool_call_id or "") + len(message.output_path or "")
    if message.name:
        total += TOKENS_PER_NAME + 2 * len(message.name)
    return total + aged_body_tokens(max_chars)


def aged_reclaimable(message: Msg, max_chars: int) -> int:
    """Tokens ageing this result would save (zero or less: not worth ageing)."""
    return message.tokens - aged_tokens_bound(message, max_chars)


def shortened_call(call: Mapping[str, Any], ref: str) -> dict[str, Any]:
    """A tool call with its arguments shortened to about ``ARGUMENT_AGED_CHARS`` characters
    (``trim_arguments``: each long string field keeps its start and end), ending with a note
    naming ``ref``; the call itself when its arguments are short already."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str) or not _shortenable(arguments):
        return dict(call)
    short = trim_arguments(arguments, ref, ARGUMENT_AGED_CHARS, note=arguments_note(ref))
    if short is None:
        return dict(call)
    return {**call, "function": {**function, "arguments": short}}


def _shortenable(arguments: str) -> bool:
    """Whether shortening keeps the arguments what they were: JSON stays JSON (an object whose
    long string fields are cut), text stays text; other JSON is left whole."""
    if len(arguments) <= ARGUMENT_AGED_CHARS:
        return False
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return True
    return isinstance(parsed, dict) and any(
        isinstance(value, str) and len(value) > 64 for value in parsed.values()
    )


def argument_saving(message: Msg) -> int:
    """Tokens shortening the long arguments of the message's calls saves, in the encoding that
    saves the least (so the recorded saving never overstates what any request sends fewer)."""
    ref = message_ref(message.id)
    long = [
        call
        for call in message.tool_calls
        if len(str((call.get("function") or {}).get("arguments") or "")) > ARGUMENT_AGED_CHARS
    ]
    if not long:
        return 0
    return min(
        sum(
            tokens.count_tool_call(call, encoding)
            - tokens.count_tool_call(shortened_call(call, ref), encoding)
            for call in long
        )
        for encoding in ENCODINGS
    )


def tool_names(branch: Sequence[Msg]) -> dict[str, str]:
    """The tool name of every call made on the branch, by call id."""
    names: dict[str, str] = {}
    for message in branch:
        for call in message.tool_calls:
            function = call.get("function") or {}
            names[str(call.get("id", ""))] = str(function.get("name", ""))
    return names


def plan_clearings(
    branch: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    *,
    keep_last: int,
    protected: Collection[str],
    min_tokens: int,
    reason: str,
    pinned: Collection[int] = frozenset(),
    stage: str = CLEARED,
    aged_chars: int = 0,
    keep_arguments: int | None = None,
) -> ClearingPlan:
    """Which tool results of ``branch`` (the messages sent, after any summary's cutoff) to take
    one step further: to ``stage`` ``cleared`` (the placeholder) or ``aged`` (the head and tail
    within ``aged_chars`` characters).

    The candidates: every result but those of the last ``keep_last`` tool calls (calls, not user
    turns: an agent run can be one user turn with a hundred calls) and of ``protected`` tools
    (compared case-insensitively, by the result's name or else its call's). A step is one-way and
    must save tokens: a full result is aged when its aged form is smaller, cleared when its
    placeholder is; an aged result can only be cleared, and only when the placeholder is smaller
    still; a cleared (or shortened) one stays as it is. With ``keep_arguments`` (and ``aged_chars``
    set), the assistant messages whose calls are all older than the last ``keep_arguments`` calls
    also have their long arguments shortened (``ARGUMENT_AGED_CHARS``), unless a call is of a
    protected tool. ``pinned`` messages (results and calls) are sent as stored while pinned: no
    step for them (a pinned result still counts among the last ``keep_last``). The plan is empty
    unless it saves at least ``min_tokens`` in all. Deterministic: the same branch and clearings
    give the same plan.

    This is where every clearing of old results is chosen (the per-conversation decision, the
    clearing after a summary, the cost replays); the idle sweep's set-based SQL states the same
    rules (``core.storage.sweep``).
    """
    if reason not in REASONS:
        raise ValueError(f"unknown clearing reason {reason!r} (expected one of {REASONS})")
    if stage not in (AGED, CLEARED):
        raise ValueError(f"a result is aged or cleared, not {stage!r}")
    results = [m for m in branch if m.role == "tool"]
    older = results[: max(len(results) - keep_last, 0)]
    names = tool_names(branch)
    shielded = {name.lower() for name in protected}
    items = []
    for message in older:
        name = message.name or names.get(message.tool_call_id or "")
        if message.id in pinned or (name or "").lower() in shielded:
            continue
        item = _result_step(message, clearings.get(message.id), stage, aged_chars)
        if item is not None:
            items.append(item)
    if keep_arguments is not None and aged_chars > 0:
        items.extend(_argument_steps(branch, clearings, keep_arguments, shielded, pinned))
        items.sort(key=lambda item: item.message_id)  # ids grow along the branch
    plan = ClearingPlan(reason, tuple(items))
    if plan.tokens_reclaimed < max(min_tokens, 1):
        return ClearingPlan(reason)
    return plan


def _result_step(
    message: Msg, current: ClearingRec | None, stage: str, aged_chars: int
) -> PlannedClearing | None:
    """The one step ``stage`` takes this result, or None (nothing to gain, or not forward)."""
    if current is None and stage == AGED:
        saved = aged_reclaimable(message, aged_chars) if aged_chars > 0 else 0
        if saved <= 0:
            return None  # a small result stays full until it is cleared
        return PlannedClearing(
            message_id=message.id, tokens_reclaimed=saved, stage=AGED, kept_chars=aged_chars
        )
    if current is None:
        saved = reclaimable(message)
        return PlannedClearing(message_id=message.id, tokens_reclaimed=saved) if saved > 0 else None
    if current.aged and stage == CLEARED:
        saved = reclaimable(message)
        gain = saved - current.tokens_reclaimed
        return (
            PlannedClearing(message_id=message.id, tokens_reclaimed=saved, gain=gain)
            if gain > 0
            else None
        )
    return None  # cleared or shortened already, or aged already


def _argument_steps(
    branch: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    keep: int,
    shielded: Collection[str],
    pinned: Collection[int] = frozenset(),
) -> list[PlannedClearing]:
    """The assistant messages whose calls are all older than the last ``keep`` calls, with long
    arguments not shortened yet and no call of a protected tool: each message's shortening."""
    calling = [m for m in branch if m.role == "assistant" and m.tool_calls]
    left = sum(len(m.tool_calls) for m in calling) - keep  # calls older than the last ``keep``
    steps = []
    for message in calling:
        left -= len(message.tool_calls)
        if left < 0:
            break
        current = clearings.get(message.id)
        if message.id in pinned:
            continue
        if current is not None and (current.arguments_tokens or current.arguments_only):
            continue
        called = [(call.get("function") or {}).get("name") for call in message.tool_calls]
        if any(str(name or "").lower() in shielded for name in called):
            continue
        saved = argument_saving(message)
        if saved > 0:
            steps.append(
                PlannedClearing(message_id=message.id, tokens_reclaimed=saved, stage=ARGUMENTS)
            )
    return steps


def min_tokens_for(reason: str, clear_at_least_tokens: int) -> int:
    """The least a plan must reclaim: the setting under pressure (a smaller saving is not worth a
    cold cache), anything at all when the cache is cold already."""
    return clear_at_least_tokens if reason == PRESSURE else 1
