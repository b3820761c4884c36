"""How large a summary may be, and cutting one that came back larger.

A summary is sent at the head of every later request, so its size is paid on every turn and it
must leave the newest turns room. Two bounds apply: the room the decision gives it
(``Split.summary_room``: half of what the trigger leaves beside the recent part it keeps) and
the cap (``RECAP_SUMMARY_MAX_OUTPUT_TOKENS``), which holds however many progressive cycles the
summary goes through. The summarizer is told the limit (its prompt and its ``max_tokens``);
an answer that is still over it is cut here, whole lines at a time: the oldest item of the
longest section first (sections are merged, never appended), then lines from the end, and a last
line by characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Count = Callable[[str], int]  # tokens of the summary as it is sent, for a candidate text
ITEM_RE = re.compile(r"\s*(?:[-*+]|\d{1,3}[.)])\s")  # a list item: "- x", "* x", "2. x"
CUT_MARK = " [...]"


def summary_limit(room: int | None, cap: int) -> int:
    """The most tokens a summary may take: its room in the request, never over the cap."""
    return cap if room is None else min(room, cap)


def _is_item(line: str) -> bool:
    return ITEM_RE.match(line) is not None


def _sections(lines: list[str]) -> list[list[int]]:
    """The item lines of each section (a section starts at a heading), by index."""
    sections: list[list[int]] = [[]]
    for index, line in enumerate(lines):
        if line.lstrip().startswith("#"):
            sections.append([])
        elif _is_item(line):
            sections[-1].append(index)
    return [items for items in sections if items]


def _oldest_of_longest(lines: list[str], removed: set[int]) -> int | None:
    """The first item still kept of the section with the most items kept (each keeps one)."""
    best: list[int] = []
    for items in _sections(lines):
        kept = [i for i in items if i not in removed]
        if len(kept) > 1 and len(kept) > len(best):
            best = kept
    return best[0] if best else None


def cut_summary(text: str, limit: int, count: Count) -> str:
    """``text`` cut until ``count`` of it is within ``limit`` (unchanged when it already is)."""
    if count(text) <= limit:
        return text
    lines = text.splitlines()
    removed: set[int] = set()

    def kept() -> str:
        return "\n".join(line for i, line in enumerate(lines) if i not in removed)

    while (item := _oldest_of_longest(lines, removed)) is not None:
        removed.add(item)
        if count(kept()) <= limit:
            return kept()
    for index in range(len(lines) - 1, 0, -1):  # then whole lines from the end, the first kept
        removed.add(index)
        if count(kept()) <= limit:
            return kept()
    return _cut_chars(kept(), limit, count)


def _cut_chars(text: str, limit: int, count: Count) -> str:
    """The longest prefix of ``text`` (marked as cut) within ``limit``, by bisection."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if count(text[:middle].rstrip() + CUT_MARK) <= limit:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + CUT_MARK if low else ""
