"""What a caller may leave unread: the oldest messages after the cutoff that no request within
the budget can hold (``omittable``), so that ``core.storage.reads`` reads only as far back as
a request can reach."""

from __future__ import annotations

from collections.abc import Callable, Collection

LightRow = tuple[str, int, str | None]
"""What ``omittable`` reads of a message: its role, its tokens as sent (a cleared result at its
placeholder size) and the call it answers (results only)."""


def omittable(
    size: int,
    budget: int,
    row_at: Callable[[int], LightRow],
    calls_of: Callable[[int], Collection[str]],
) -> int:
    """How many of the ``size`` oldest messages after the cutoff no request within ``budget`` can
    hold. ``row_at(i)`` describes message ``i`` (oldest first) and ``calls_of(i)`` gives the call
    ids of assistant message ``i``; they are asked newest first and only as far back as needed,
    so a caller can read rows lazily.

    Keeping a message keeps its unit and every newer one: each newer non-tool message starts a
    unit, and a result right after the assistant message that made its call belongs to that
    unit. So once those add up, from the newest back, to more than the budget, that message and
    all older ones are dropped whatever the fixed parts are. The last user message is never
    counted out, so the tail (and its error) stay whole. Not for text-only requests, whose counts
    are made anew.
    """
    total = 0
    last_user: int | None = None
    results: list[tuple[str | None, int]] = []  # the tool messages after the current one
    for index in range(size - 1, -1, -1):
        role, count, answers = row_at(index)
        if total > budget:  # over already: only the last user message is still looked for
            if role == "user":
                return index
            continue
        if role == "tool":
            results.append((answers, count))
            continue
        if role == "user" and last_user is None:
            last_user = index
        total += count
        if results and role == "assistant":
            calls = calls_of(index)
            total += sum(n for call_id, n in results if call_id in calls)
        results = []
        if total > budget and last_user is not None:
            return min(index + 1, last_user)
    return 0
