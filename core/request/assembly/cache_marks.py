"""Stage 11, cache marks (Anthropic-style breakpoints), when asked for: by default for Anthropic
models, not in a text-only request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from recap.core.counting import reasoning, tokens
from recap.core.request import render
from recap.core.request.assembly.given import Given
from recap.core.values.draft import Draft

MAX_CACHE_MARKS = 4  # Anthropic takes at most four cache breakpoints per request
ROLLING_MARKS = 2  # the newest messages marked: this request writes what the next one reads
# The roles whose neighbouring turns a text-only request merges (``render.alternated``).
MERGED_ROLES = ("user", "assistant")


def stage(given: Given, draft: Draft) -> Draft:
    """The messages with their cache marks, and the tokens the marks add."""
    wanted = given.request.cache_breakpoints
    if wanted is None:
        wanted = given.family == reasoning.ANTHROPIC and not given.request.text_only
    if not wanted:
        return draft
    ends = draft.ends
    messages = list(draft.messages)
    stable = [m for m in (ends.memory, ends.summary, *ends.block) if m is not None]
    positions = _marked(
        messages,
        has_system=ends.system is not None,
        stable=_turns(stable) if given.request.text_only else len(stable),
        has_reminder=ends.reminder is not None,
    )
    added = 0
    for position in positions:
        before = messages[position]
        messages[position] = render.with_cache_mark(before)
        added += tokens.count_message(messages[position], given.encoding)
        added -= tokens.count_message(before, given.encoding)
    tally = replace(draft.tally, history=draft.tally.history + added)
    return replace(draft, messages=messages, tally=tally)


def _turns(messages: Sequence[dict[str, Any]]) -> int:
    """How many turns ``messages`` become once neighbours of one role merge, as a text-only
    request merges them (``core.request.render.alternated``)."""
    turns, last = 0, None
    for message in messages:
        role = message.get("role")
        if role != last or role not in MERGED_ROLES:
            turns += 1
        last = role
    return turns


def _marked(
    messages: Sequence[dict[str, Any]], *, has_system: bool, stable: int, has_reminder: bool
) -> tuple[int, ...]:
    """Where the cache breakpoints go: after the stable prefix (the system prompt, which tools
    come before, then the ``stable`` messages after it: the summary and the pinned messages it
    covers, as merged turns in a text-only request) and on the newest two messages before the
    reminder that carry text. The provider caches the prefix up to a mark, so the next request,
    which only adds messages, reads everything this one wrote and pays in full only for what is
    new. At most four marks."""
    prefix = [0] if has_system else []
    after_system = 1 if has_system else 0
    if stable:
        prefix.append(after_system + stable - 1)
    end = len(messages) - (1 if has_reminder else 0)
    rolling: list[int] = []
    for position in range(end - 1, after_system + stable - 1, -1):
        if len(rolling) == min(ROLLING_MARKS, MAX_CACHE_MARKS - len(prefix)):
            break
        if tokens.content_text(messages[position].get("content")).strip():
            rolling.append(position)
    return (*prefix, *rolling)
