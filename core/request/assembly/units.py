"""Stage 2, units: the system prompt, the messages after the cutoff as units with valid tool pairs
(a call and its results are kept or dropped together), and where the tail (the last user message
on) starts."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from recap.core.counting import tokens
from recap.core.errors import InputError
from recap.core.request import render
from recap.core.request.assembly.given import Given
from recap.core.request.assembly.parts import after_cutoff, system_part
from recap.core.request.assembly.rendering import render as render_item
from recap.core.values.draft import Draft, History, Unit
from recap.core.values.records import ClearingRec, Msg


def stage(given: Given, draft: Draft) -> Draft:
    """The system message, and the history after the cutoff split into older units and tail."""
    root, request = draft.root, given.request
    system_message, system_tokens = system_part(root, request.system, given.encoding)
    summary = given.stored.summary
    after = after_cutoff(draft.branch[1:] if root is not None else draft.branch, summary, root)
    if not after and summary is None:
        raise InputError("nothing to send: the branch has no message besides a system prompt")
    units, orphans, repeated = build_units(
        after,
        draft.cleared,
        given.stored.missing_outputs,
        given.encoding,
        text_only=request.text_only,
        pins=given.pins,
    )
    split = last_user_unit(units)
    return replace(
        draft,
        tally=replace(draft.tally, system=system_tokens),
        ends=replace(draft.ends, system=system_message),
        history=History(
            after=after,
            older=units[:split],
            tail=units[split:],
            orphans=orphans,
            repeated_call_ids=repeated,
        ),
    )


# A plain message's unit is made once per message after the cutoff on every request: built as
# the tuple it is, without the named tuple's own ``__new__`` (a Python call) in between.
_as_unit = tuple.__new__


def build_units(
    messages: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    missing_outputs: Collection[str],
    encoding: str,
    *,
    text_only: bool,
    pins: Collection[int] = frozenset(),
) -> tuple[list[Unit], list[int], bool]:
    """The history as units with valid tool pairs, the ids of orphan results dropped, and
    whether any call id is used twice (only then are ids made unique: ``unique_call_ids``).
    A pinned orphan result is not dropped: it is sent in its place as its text-only form.

    This runs over every message after the cutoff on each request, so it stays a flat loop.
    """
    results: dict[str, list[int]] = {}
    for index, message in enumerate(messages):
        if message.role == "tool":
            results.setdefault(message.tool_call_id or "", []).append(index)
    used: set[int] = set()
    units: list[Unit] = []
    orphans: list[int] = []
    call_ids: set[str] = set()
    calls = 0
    for index, message in enumerate(messages):
        role = message.role
        if role == "tool":
            if index in used:
                continue
            if message.id in pins:  # no call to answer: sent as text, as after a summary
                text = render.text_only_results([message.to_openai()])
                count = tokens.count_message(text, encoding)
                units.append(Unit((text,), (message.id,), count, False, True))
            else:
                orphans.append(message.id)
        elif role == "assistant" and message.tool_calls:
            calls += len(message.tool_calls)
            answers, stubs = _answers(index, message, results, used, call_ids)
            stored = [messages[j] for j in answers]
            unit = _group_unit(message, stored, stubs, clearings, encoding, pins)
            if text_only:
                unit = _text_only_unit(unit, clearings, missing_outputs, encoding)
            units.append(unit)
        else:
            plain = ((message,), (message.id,), message.tokens, role == "user", message.id in pins)
            units.append(_as_unit(Unit, plain))
    return units, orphans, len(call_ids) < calls


def _answers(
    index: int, message: Msg, results: dict[str, list[int]], used: set[int], seen: set[str]
) -> tuple[list[int], list[dict[str, Any]]]:
    """For each call of ``message``: the first unused stored result after it, or a stub. The
    call ids go into ``seen``."""
    answers: list[int] = []
    stubs: list[dict[str, Any]] = []
    for call in message.tool_calls:
        call_id = str(call.get("id", ""))
        seen.add(call_id)
        for j in results.get(call_id, ()):
            if j > index and j not in used:
                used.add(j)
                answers.append(j)
                break
        else:
            stubs.append(render.stub_result(call))
    if len(answers) > 1:
        answers.sort()  # stored order, not call order
    return answers, stubs


def _group_unit(
    message: Msg,
    stored: list[Msg],
    stubs: list[dict[str, Any]],
    clearings: Mapping[int, ClearingRec],
    encoding: str,
    pins: Collection[int],
) -> Unit:
    """A call with its results: stored counts (cleared ones at placeholder size, aged ones at
    their recorded size, shortened arguments taken off) plus stubs; pinned when any of its
    messages is."""
    calling = clearings.get(message.id)
    count = message.tokens - (calling.arguments_tokens if calling is not None else 0)
    ids = [message.id]
    for result in stored:
        ids.append(result.id)
        cleared = clearings.get(result.id)
        count += result.tokens - (cleared.tokens_reclaimed if cleared is not None else 0)
    for stub in stubs:
        count += tokens.count_message(stub, encoding)
    pinned = bool(pins) and any(mid in pins for mid in ids)
    return Unit((message, *stored, *stubs), tuple(ids), count, False, pinned)


def _text_only_unit(
    unit: Unit,
    clearings: Mapping[int, ClearingRec],
    missing_outputs: Collection[str],
    encoding: str,
) -> Unit:
    """The same call group as two plain turns, counted as they will be sent."""
    rendered = [render_item(item, clearings, missing_outputs, encoding) for item in unit.items]
    turns = (render.text_only_call(rendered[0]), render.text_only_results(rendered[1:]))
    count = sum(tokens.count_message(turn, encoding) for turn in turns)
    return Unit(turns, unit.ids, count, False, unit.pinned)


def last_user_unit(units: Sequence[Unit]) -> int:
    """Where the tail starts: the last user message (the whole history when there is none)."""
    for position in range(len(units) - 1, -1, -1):
        if units[position].is_user:
            return position
    return 0
