"""Recall references (pure): how a placeholder or a summary names what it stands for.

A cleared tool result's placeholder says ``ref=m<message id>``, a summary ends with a note naming
``ref=s<cutoff message id>`` (the span it covers), and a media part of a message is
``m<message id>.<part index>``. ``Recap.recall(conversation_id, ref)`` takes any of them back to
the original (``core.recall``); the model can ask for it with the ``recap_recall`` tool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MESSAGE, SPAN, PART = "message", "span", "part"
REF_RE = re.compile(r"^(?:(m)([1-9][0-9]{0,18})(?:\.([0-9]{1,4}))?|(s)([1-9][0-9]{0,18}))$")
# The tokens a reference's value can take in a placeholder: "m" and up to 19 digits, which
# tokenizers split into runs of three (one more token of slack for a shifted boundary).
REF_VALUE_TOKENS = 9
SUMMARY_NOTE = "\n\n[The messages this summary covers can be recalled: ref={ref}]"


@dataclass(frozen=True, slots=True)
class Ref:
    """A parsed reference: what it names, the message (or cutoff) id, and a media part."""

    kind: str
    message_id: int
    part: int | None = None

    def __str__(self) -> str:
        if self.kind == SPAN:
            return span_ref(self.message_id)
        if self.kind == PART and self.part is not None:
            return part_ref(self.message_id, self.part)
        return message_ref(self.message_id)


def message_ref(message_id: int) -> str:
    """The reference of a stored message (a cleared or aged tool result, say)."""
    return f"m{message_id}"


def span_ref(cutoff_message_id: int) -> str:
    """The reference of the span a summary up to ``cutoff_message_id`` covers."""
    return f"s{cutoff_message_id}"


def part_ref(message_id: int, part: int) -> str:
    """The reference of one media part (by its index in the message's content)."""
    return f"m{message_id}.{part}"


def summary_note(cutoff_message_id: int) -> str:
    """What a summary message ends with: the reference of the span it covers."""
    return SUMMARY_NOTE.format(ref=span_ref(cutoff_message_id))


def parse_ref(text: str) -> Ref | None:
    """The reference ``text`` names, or None when it is not one (``ref=`` is allowed before)."""
    value = text.strip().removeprefix("ref=")
    match = REF_RE.match(value)
    if match is None:
        return None
    if match.group(4):
        return Ref(SPAN, int(match.group(5)))
    message_id = int(match.group(2))
    if match.group(3) is not None:
        return Ref(PART, message_id, int(match.group(3)))
    return Ref(MESSAGE, message_id)
