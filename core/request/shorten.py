"""Shortening what must be sent but cannot fit whole (pure): a result of the newest step, a summary.

The tail of a request (the last user message and the tool calls and results after it) is never
dropped. When one of its tool results is larger than the room beside the fixed parts, it is sent
shortened instead: its head and its tail around a note that says how much was left out and where
the whole output is. The shortening is recorded as a clearing of reason ``shortened`` whose
``tokens_reclaimed`` fixes the size it renders at, so the same state renders the same bytes and the
decisions that read no content plan with the size that is sent.

A summary that would crowd the tail out of the window is sent the same way (head and tail within
the room), and the request reports itself truncated.

An aged tool result (the aged stage, ``core.decision.toolresults``) is sent the same way too: its
head and tail within the character cap its clearing row names and within the size the row
recorded (``aged_text``), around a note naming how much is left out, its reference and the saved
file. The row's size is an upper bound worked out without the text; the cut is made to fit it as
sent, so the count every decision plans with is never below what is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from recap.core.counting import tokens
from recap.core.decision.toolresults import AGED_HEAD_SHARE
from recap.core.request.placeholders import aged_note

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


# --- the aged stage ----------------------------------------------------------------------------

DEFAULT_AGED_CHARS = 4_000  # RECAP_AGED_RESULT_CHARS' default, for a row that names no cap
AGED_RENDER_CACHE = 2_048  # aged results kept rendered: a request resends the same ones
_AGED_TRIES = 4  # rounds of cutting a little more when the cuts' merges went over the size


def aged_text(
    text: str,
    *,
    keep: int,
    max_chars: int,
    frame: int,
    encoding: str,
    ref: str,
    path: str | None = None,
    file_exists: bool = True,
) -> str:
    """An aged tool result's content: the output's head and tail around a note that says how
    much is left out, its recall reference and where the whole output is saved, within
    ``max_chars`` characters and, with ``frame`` (the tokens of the message around its content),
    within ``keep`` tokens as sent. Deterministic; cached."""
    return _aged_text(text, keep, max_chars, frame, encoding, ref, path, file_exists)


@lru_cache(maxsize=AGED_RENDER_CACHE)
def _aged_text(
    text: str,
    keep: int,
    max_chars: int,
    frame: int,
    encoding: str,
    ref: str,
    path: str | None,
    file_exists: bool,
) -> str:
    coder = tokens.get_encoding(encoding)
    ids = coder.encode_ordinary(text)
    if len(text) <= max_chars and frame + len(ids) <= keep:
        return text  # whole within both sizes
    widest = aged_note(left=len(text), ref=ref, output_path=path, file_exists=file_exists)
    if len(widest) > max_chars // 2:  # a very long path: the reference alone says where
        path = None
        widest = aged_note(left=len(text), ref=ref)
    chars = max(max_chars - len(widest), 0)
    body = keep - frame - tokens.count_text(widest, encoding)
    out = widest.strip()
    for _ in range(_AGED_TRIES):
        if body <= 0 or chars <= 0:
            break
        head_ids = int(body * AGED_HEAD_SHARE)
        head = _decoded(coder, ids[:head_ids])[: int(chars * AGED_HEAD_SHARE)]
        tail = _decoded(coder, ids[len(ids) - (body - head_ids) :]) if body > head_ids else ""
        tail = tail[len(tail) - min(len(tail), chars - len(head)) :]
        head, tail = _at_lines(head, tail)
        note = aged_note(
            left=len(text) - len(head) - len(tail),
            ref=ref,
            output_path=path,
            file_exists=file_exists,
        )
        candidate = head + note + tail
        over = frame + tokens.count_text(candidate, encoding) - keep
        if over <= 0:
            return candidate
        body -= over
    return out  # no room for any of the output: the note alone


def _at_lines(head: str, tail: str) -> tuple[str, str]:
    """The head cut after its last whole line and the tail from its first whole line, when that
    keeps most of each (an output is read line by line); only ever shorter."""
    end = head.rfind("\n") + 1
    if end > len(head) // 2:
        head = head[:end]
    start = tail.find("\n") + 1
    if 0 < start < len(tail) // 2:
        tail = tail[start:]
    return head, tail


def _decoded(coder: Any, ids: Sequence[int]) -> str:
    """Tokens back to text, a character split at a cut left out."""
    return bytes(coder.decode_bytes(list(ids))).decode("utf-8", errors="ignore")
