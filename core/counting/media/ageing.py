"""Ageing media into placeholders, oldest first, recorded as a clearing of its own reason."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recap.core.counting.media.kinds import MediaError
from recap.core.counting.media.parts import check_part, data_of, kind_of, meta_of, ref_of, with_data
from recap.core.counting.media.pricing import part_tokens
from recap.core.counting.media.request import (
    MediaPolicy,
    data_field,
    media_positions,
    sent_bytes,
    strip_meta,
)
from recap.core.counting.media.text import placeholder_part

TURNS, CAP, BYTES, TEXT_ONLY = "turns", "cap", "bytes", "text-only"


RECORDED = "media"  # the clearing reason of a message whose media all renders as placeholders


@dataclass(frozen=True, slots=True)
class AgeingPlan:
    """Which media parts of which messages are sent as placeholders, and why."""

    aged: dict[int, frozenset[int]]  # message id -> positions of its aged parts
    reasons: dict[int, str]


def plan_ageing(
    messages: Sequence[Any],
    *,
    policy: MediaPolicy,
    model: str | None,
    recorded: Iterable[int] = (),
    text_only: bool = False,
    room: int | None = None,
) -> AgeingPlan:
    """Media older than the last ``keep_turns`` user turns, of a message already recorded as
    aged, or beyond the caps (the newest parts are kept, counting back until one does not fit:
    a contiguous newest run) is aged. ``messages`` are ``Msg`` rows after the summary's cutoff,
    oldest first; a text-only request ages every part.

    The media of the current user message (the last one) is sent for the request it was sent
    for: the caps apply to older media only, and its parts are kept whenever they fit ``room``
    (the request's budget; None: no limit), counted first against the caps the older ones
    share. With no media kept (text-only, ``keep_turns`` 0) it ages too."""
    done = set(recorded)
    starts = [i for i, m in enumerate(messages) if m.role == "user"]
    if text_only or policy.keep_turns == 0:
        keep_from = len(messages)
    elif len(starts) >= policy.keep_turns:
        keep_from = starts[-policy.keep_turns]
    else:
        keep_from = 0
    current = starts[-1] if starts and keep_from < len(messages) else None
    aged: dict[int, set[int]] = {}
    reasons: dict[int, str] = {}
    full: list[tuple[int, int, Any]] = []  # message id, position, part: newest last
    now: list[tuple[int, int, Any]] = []  # the current user message's parts
    for index, message in enumerate(messages):
        positions = media_positions(message.content_parts)
        if not positions:
            continue
        if index == current and message.id not in done:
            now.extend((message.id, p, message.content_parts[p]) for p in positions)
            continue
        if index < keep_from or message.id in done:
            aged[message.id] = set(positions)
            reasons[message.id] = TEXT_ONLY if text_only else TURNS
            continue
        full.extend((message.id, p, message.content_parts[p]) for p in positions)
    parts = len(now)
    tokens = sum(part_tokens(part, model) for _, _, part in now)
    if now and room is not None and tokens > room:  # the window cannot hold them: placeholders
        aged[now[0][0]] = {position for _, position, _ in now}
        reasons[now[0][0]] = CAP
        parts = tokens = 0
    over = False
    for mid, position, part in reversed(full):
        cost = part_tokens(part, model)
        over = over or parts + 1 > policy.max_parts or tokens + cost > policy.max_tokens
        if over:
            aged.setdefault(mid, set()).add(position)
            reasons.setdefault(mid, CAP)
        else:
            parts, tokens = parts + 1, tokens + cost
    return AgeingPlan({k: frozenset(v) for k, v in aged.items()}, reasons)


Counter = Callable[[Mapping[str, Any]], int]


@dataclass(frozen=True, slots=True)
class Finished:
    """The request's messages as sent, with what the media in them costs."""

    messages: list[dict[str, Any]]
    media_tokens: int  # of the parts sent in full after the system prompt
    tokens_delta: int  # what the byte guard and missing stored copies changed (<= 0)
    aged_by_bytes: int  # parts the byte guard sent as placeholders


def finish(
    messages: list[dict[str, Any]],
    policy: MediaPolicy,
    *,
    model: str | None,
    count: Counter,
    keep: Collection[int] = (),
) -> Finished:
    """Apply the byte guard (the oldest media first, until the request is within
    ``max_request_bytes``; the media of the messages at the positions ``keep`` names, pinned
    ones, only once no other is left), put the stored bytes back, and take Recap's key off every
    part."""
    out = list(messages)
    spots = [
        (i, p)
        for i, message in enumerate(out)
        if isinstance(message.get("content"), list)
        for p in media_positions(message["content"])
    ]
    if not spots:
        return Finished(out, 0, 0, 0)
    delta = aged = 0
    kept = set(keep)
    order = iter(sorted(spots, key=lambda spot: spot[0] in kept) if kept else spots)
    while request_bytes(out) > policy.max_request_bytes:
        spot = next(order, None)
        if spot is None:
            break
        delta += _replace(out, spot, count, unavailable=False)
        aged += 1
    media = 0
    for index, position in spots:
        part = out[index]["content"][position]
        if not kind_of(part):
            continue
        ref = ref_of(part)
        value = policy.load(ref) if ref is not None and policy.load is not None else None
        if ref is not None and value is None:
            delta += _replace(out, (index, position), count, unavailable=True)
            continue
        if index > 0 or out[0].get("role") not in ("system", "developer"):
            media += part_tokens(part, model)
        if value is not None:
            _set_part(out, (index, position), with_data(part, data_field(meta_of(part), value)))
    for index in {i for i, _ in spots}:
        out[index] = {**out[index], "content": [strip_meta(p) for p in out[index]["content"]]}
    return Finished(out, media, delta, aged)


def request_bytes(messages: Sequence[Mapping[str, Any]]) -> int:
    """The JSON size of the messages with every stored part's bytes put back."""
    import json

    size = len(json.dumps(list(messages), ensure_ascii=False).encode("utf-8"))
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if kind_of(part) and ref_of(part) is not None:
                    size += sent_bytes(part) - len(data_of(part) or "")
    return size


def _set_part(out: list[dict[str, Any]], spot: tuple[int, int], part: Any) -> None:
    index, position = spot
    content = list(out[index]["content"])
    content[position] = part
    out[index] = {**out[index], "content": content}


def _replace(
    out: list[dict[str, Any]], spot: tuple[int, int], count: Counter, *, unavailable: bool
) -> int:
    """Send one part as its placeholder; the tokens this changes."""
    before = count(out[spot[0]])
    part = out[spot[0]]["content"][spot[1]]
    _set_part(out, spot, placeholder_part(part, unavailable=unavailable))
    return count(out[spot[0]]) - before


def check_parts(content: Sequence[Any], where: str) -> None:
    """Every media part of a message's content is storable: one ``MediaError`` naming the first
    that is not (the message and the part's position)."""
    for index, part in enumerate(content):
        if isinstance(part, Mapping) and any(str(key).startswith("_") for key in part):
            raise MediaError(f"{where} part {index}: keys starting with '_' are Recap's own")
        if kind_of(part):
            check_part(part, f"{where} part {index}")
