"""Shortening what must be sent but cannot fit whole (pure): a result of the newest step, a summary.

The tail of a request (the last user message and the tool calls and results after it) is never
dropped. When one of its tool results is larger than the room beside the fixed parts, it is sent
shortened instead: its head and its tail around a note that says how much was left out and where
the whole output is. The shortening is recorded as a clearing of reason ``shortened`` whose
``tokens_reclaimed`` fixes the size it renders at, so the same state renders the same bytes and the
decisions that read no content plan with the size that is sent.

A summary that would crowd the tail out of the window is sent the same way (head and tail within
the room), and the request reports itself truncated.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.counting import tokens

SHORTENED = "shortened"  # the clearing reason of a result sent as its head and tail
NOTE_ALLOWANCE = 80  # the note, the message overhead and token merges at the two cuts, at most
MIN_KEPT_TOKENS = NOTE_ALLOWANCE + 8  # the least a shortened result takes: the note and a little
_NOTE = "\n[... {left} tokens of this {what} are left out here to fit the context window{where}]\n"
_SAVED = "; the full output is saved at {path}."
_NOT_SAVED = "; run the tool again with a narrower request if you need them."


def kept_tokens_for(sizes: Sequence[int], excess: int) -> int | None:
    """The largest size ``cap`` (at least ``MIN_KEPT_TOKENS``) such that cutting every size above
    it down to ``cap`` saves at least ``excess`` tokens; None when even the smallest cap cannot.

    Cutting the largest results first to one common size changes as few results as possible and
    keeps the most of each."""
    if excess <= 0:
        return max(sizes, default=MIN_KEPT_TOKENS)

    def saved(cap: int) -> int:
        return sum(size - cap for size in sizes if size > cap)

    if saved(MIN_KEPT_TOKENS) < excess:
        return None
    low, high = MIN_KEPT_TOKENS, max(sizes)
    while low < high:  # the largest cap that still saves enough
        middle = (low + high + 1) // 2
        if saved(middle) >= excess:
            low = middle
        else:
            high = middle - 1
    return low


def head_and_tail(
    text: str, keep: int, encoding: str, *, path: str | None = None, what: str = "output"
) -> str:
    """``text`` within about ``keep`` tokens as sent in a message: its first and last tokens
    around a note naming what was left out and where the whole is. Deterministic."""
    body = max(keep - NOTE_ALLOWANCE, 2)
    coder = tokens.get_encoding(encoding)
    ids = coder.encode(text, disallowed_special=())
    if len(ids) <= body:
        return text
    head = body // 2
    tail = body - head
    where = _SAVED.format(path=path) if path else _NOT_SAVED if what == "output" else "."
    note = _NOTE.format(left=len(ids) - body, what=what, where=where)
    return coder.decode(ids[:head]) + note + coder.decode(ids[-tail:])
