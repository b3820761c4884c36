"""Stage 8, the whole request with its media finished: media sent in full counted apart
(``tally.media``); the byte guard ages the oldest parts first (pinned messages last), then
leaves the oldest kept history out (``shed_bytes``), reported as dropped like any other."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from recap.core.counting import media, tokens
from recap.core.request.assembly.given import Given
from recap.core.request.assembly.history import history_within
from recap.core.request.assembly.rendering import render
from recap.core.values.draft import Draft, Ends, Fitted

JSON_BYTES_PER_CHAR = 6  # the most one character takes in the JSON of a request (an escape)
MESSAGE_FRAME_BYTES = 200  # role, keys and call ids around a message's text, at most


def stage(given: Given, draft: Draft) -> Draft:
    """The request's messages with media finished, within the byte guard."""
    fitted = draft.fitted
    assert fitted is not None
    finished = _finished(given, draft.ends, fitted)
    excess = _bytes_over(finished.messages, given.policy.max_request_bytes)
    if excess > 0 and fitted.kept_from < len(draft.history.older):  # media aged first
        fitted = shed_bytes(given, draft, fitted, excess)  # then older history
        finished = _finished(given, draft.ends, fitted)
    history = draft.tally.history + finished.tokens_delta - finished.media_tokens
    return replace(
        draft,
        fitted=fitted,
        messages=finished.messages,
        tally=replace(draft.tally, media=finished.media_tokens, history=history),
    )


def _finished(given: Given, ends: Ends, fitted: Fitted) -> media.Finished:
    """The whole request with its media finished (``media.finish``), pinned messages last to
    age."""
    model = given.target.model
    held = _pinned_positions(ends, fitted)
    encoding = tokens.encoding_name_for(model)
    return media.finish(
        _whole(ends, fitted),
        given.policy,
        model=model,
        count=lambda message: tokens.count_message(message, encoding, model=model),
        keep=held,
    )


def _pinned_positions(ends: Ends, fitted: Fitted) -> tuple[int, ...]:
    """Where the pinned messages sit in ``_whole``'s list: the byte guard ages their media last."""
    start = sum(1 for m in (ends.system, ends.memory, ends.summary) if m is not None)
    history = start + len(ends.block)
    return (*range(start, history), *(history + i for i in fitted.pinned_at))


def _whole(ends: Ends, fitted: Fitted) -> list[dict[str, Any]]:
    """The request's messages: the system prompt and summary, the pinned messages the summary
    covers, the history, the reminder."""
    messages = [m for m in (ends.system, ends.memory, ends.summary) if m is not None]
    messages.extend(ends.block)
    messages.extend(fitted.messages)
    if ends.reminder is not None:
        messages.append(ends.reminder)
    return messages


def _bytes_over(messages: Sequence[Mapping[str, Any]], limit: int) -> int:
    """How many bytes the request is over ``limit`` (<= 0: within it). A bound from the text
    lengths answers most requests without serializing them; only one near the limit is."""
    bound = 0
    for message in messages:
        content = message.get("content")
        size = len(content) if isinstance(content, str) else len(json.dumps(content))
        for call in message.get("tool_calls") or ():
            size += len(str((call.get("function") or {}).get("arguments", "")))
            size += MESSAGE_FRAME_BYTES
        bound += size * JSON_BYTES_PER_CHAR + MESSAGE_FRAME_BYTES
    if bound <= limit:
        return bound - limit
    return media.request_bytes(messages) - limit


def shed_bytes(given: Given, draft: Draft, fitted: Fitted, excess: int) -> Fitted:
    """The history with the oldest kept units left out until about ``excess`` bytes are gone
    (the byte guard, once aged media was not enough)."""
    older, cleared = draft.history.older, draft.cleared
    missing, encoding = given.stored.missing_outputs, given.encoding
    start = fitted.kept_from
    shed = 0
    while start < len(older) and shed < excess:
        if older[start].pinned:  # sent wherever the kept run starts: nothing to shed
            start += 1
            continue
        rendered = [render(item, cleared, missing, encoding) for item in older[start].items]
        shed += len(json.dumps(rendered, ensure_ascii=False).encode("utf-8"))
        start += 1
    return history_within(given, draft, 0, cut=True, start=start)
