"""What the extraction model reads (pure): the last messages of the turn's branch, started at a
user message where possible, cut to size keeping the end, and noting what was left out.

1. The messages: user and assistant text only. Tool results, system prompts and the messages a
   host injects for the model (a Recap summary, memory block, context file or gap note, or a
   message whose ``extra`` says ``"recap_meta": true``) are left out: they are not the user
   speaking. An assistant's tool calls are shown as ``[Used tools: name, ...]``.
2. The last ``size`` of them (5 by default), from the first user message among them (when none
   is, as they are): an extraction reads what the user said and the answers to it.
3. The cut, in two steps, keeping the end (the newest words matter most): first by characters,
   at 8 per token of the limit (cheap, and enough for all but unusual text), then by the
   tokenizer's count, to the limit itself. Whatever was cut is noted in front, with its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recap.core.counting import tokens
from recap.core.request.assembly.parts import GAP_NOTE
from recap.core.request.memory import MEMORY_INSTRUCTION
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.core.values.records import Msg

CHARS_PER_TOKEN = 8  # the first cut: generous, so the tokenizer's count decides the end
META_KEY = "recap_meta"  # a host marks a message it injected with ``extra["recap_meta"]``
META_PREFIXES = (
    SUMMARY_MESSAGE_PREFIX.strip(),
    MEMORY_INSTRUCTION[:40],
    "[Context file:",
    GAP_NOTE,
)
OMITTED = "[... {chars} earlier characters of the conversation left out ...]"
WINDOW_ENCODING = "o200k_base"


@dataclass(frozen=True, slots=True)
class Line:
    """One message of the window as the extraction model reads it."""

    role: str
    text: str
    message_id: int


@dataclass(frozen=True, slots=True)
class Window:
    """The window: its messages, the text the model reads, and what the cut left out."""

    lines: tuple[Line, ...]
    text: str
    omitted_chars: int  # characters of the transcript left out in front (0: none)
    cut: str | None  # "chars", "tokens" (the last step that cut) or None

    @property
    def has_user(self) -> bool:
        return any(line.role == "user" for line in self.lines)


def is_meta(message: Msg) -> bool:
    """Whether a message was injected for the model rather than said in the conversation."""
    if message.extra and message.extra.get(META_KEY):
        return True
    text = (message.content or "").lstrip()
    return any(text.startswith(prefix) for prefix in META_PREFIXES)


def spoken(message: Msg) -> Line | None:
    """A message as a window line: user and assistant text (and tool calls named), else None."""
    if message.role not in ("user", "assistant") or is_meta(message):
        return None
    text = tokens.content_text(
        message.content if message.content is not None else list(message.content_parts or ())
    ).strip()
    if message.role == "assistant" and message.tool_calls:
        names = ", ".join(
            str((c.get("function") or {}).get("name", "?")) for c in message.tool_calls
        )
        text = f"{text}\n[Used tools: {names}]".strip()
    return Line(message.role, text, message.id) if text else None


def last_messages(branch: Sequence[Msg], size: int) -> tuple[Line, ...]:
    """The last ``size`` spoken messages, from the first user message among them."""
    lines = [line for line in (spoken(m) for m in branch) if line is not None][-size:]
    for index, line in enumerate(lines):
        if line.role == "user":
            return tuple(lines[index:])
    return tuple(lines)


def transcript(lines: Sequence[Line]) -> str:
    """The window's messages as one text, oldest first."""
    return "\n\n".join(f"{line.role}: {line.text}" for line in lines)


def cut(text: str, max_tokens: int, encoding: str = WINDOW_ENCODING) -> tuple[str, int, str | None]:
    """``text`` within ``max_tokens``, keeping its end: by characters first (8 per token), then
    by tokens. The kept text, the characters left out, and the last step that cut."""
    kept, step = text, None
    chars = max_tokens * CHARS_PER_TOKEN
    if len(kept) > chars:
        kept, step = kept[-chars:], "chars"
    encoded = tokens.get_encoding(encoding).encode(kept, disallowed_special=())
    if len(encoded) > max_tokens:
        kept = tokens.get_encoding(encoding).decode(encoded[-max_tokens:]).lstrip("\ufffd")
        step = "tokens"
    return kept, len(text) - len(kept), step


def window(branch: Sequence[Msg], *, size: int = 5, max_tokens: int = 12_000) -> Window:
    """The extraction window of a branch (root first): see the module's text."""
    lines = last_messages(branch, size)
    whole = transcript(lines)
    kept, omitted, step = cut(whole, max_tokens)
    text = f"{OMITTED.format(chars=omitted)}\n{kept}" if omitted else kept
    return Window(lines=lines, text=text, omitted_chars=omitted, cut=step)
