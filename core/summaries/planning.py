"""Compression planning (pure): whether to compress, where to cut, what the summarizer is sent,
and whether what came back may be stored.

The worker reads plain values, asks these functions what to do, calls the model with no database
session held, and writes the result. Nothing here does I/O; token counts come from the stored rows
or from a counter passed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from recap.core.counting import media
from recap.core.request.branch import effective_history_tokens, messages_after_cutoff
from recap.core.summaries.prompts import (
    CUTOFF_MARKER,
    NO_PREVIOUS_SUMMARY,
    PREVIOUS_SUMMARY_PLACEHOLDER,
    RETENTION_REMINDER,
    SUMMARY_REMINDER,
)
from recap.core.values.records import SYSTEM_ROLES, ClearingRec, Msg, SummaryRec

if TYPE_CHECKING:
    from recap.core.summaries.onprefix import SentRequest

Counter = Callable[[Mapping[str, Any]], int]
Rendered = dict[str, str]

OLDER_RESULT_CHARS = 2_000  # a tool result being summarized is shown up to this size
RECENT_RESULT_CHARS = 600  # a tool result shown only as context is cut harder
ARGUMENT_CHARS = 500  # tool-call arguments shown to the summarizer are cut here
SUMMARIZER_MARGIN = 0.05  # the summarizer's window keeps the same safety margin as the host's
RECENT_CONTEXT_SHARE = 0.25  # at most this share of the summarizer's input is recent context
RETENTION_LIST_TOKENS = 400  # room kept for the list of missing identifiers on a second ask
MIN_CHUNK_TOKENS = 500  # a chunk smaller than this summarizes nothing worth the call
REQUEST_PRIMING_TOKENS = 3  # every request is primed with the assistant's reply header
TRIM_SAFETY = 0.9  # characters per token vary: trim a little below the computed share
COOLDOWN_MAX_FACTOR = 16  # a cooldown doubles with each further failure, up to this many times
# The words a "not smaller" rejection carries: the planner sent too small a span, so it is not
# counted as a failure of the summarizer (``core.decision.policy.Failure.counts``).
REJECTED_NOT_SMALLER = "does not reduce the"

ERROR_TEXT_RE = re.compile(
    r"^\s*(?:error\b|exception\b|traceback\b|internal server error|rate limit|"
    r"i'm sorry|i am sorry|sorry,|i cannot\b|i can't\b|i can not\b|as an ai\b|"
    r"<!doctype html|<html|\{\s*\"error\")",
    re.IGNORECASE,
)


# --- what is pending ---------------------------------------------------------------------------


def split_root(branch: Sequence[Msg]) -> tuple[Msg | None, list[Msg]]:
    """The stored system prompt at the root (the request always sends it, so it is never
    summarized) and the rest of the branch."""
    if branch and branch[0].role in SYSTEM_ROLES:
        return branch[0], list(branch[1:])
    return None, list(branch)


def pending_messages(branch: Sequence[Msg], summary: SummaryRec | None) -> list[Msg]:
    """The messages a summary could still cover: after the applicable summary's cutoff, without
    the root system prompt."""
    _, rest = split_root(branch)
    return messages_after_cutoff(rest, summary)


def request_history_tokens(
    branch: Sequence[Msg], summary: SummaryRec | None, clearings: Mapping[int, ClearingRec]
) -> int:
    """Stored tokens of what a request carries for this branch: the root system prompt, the
    summary, and the messages after its cutoff (cleared results at their placeholder size)."""
    root, rest = split_root(branch)
    return (root.tokens if root else 0) + effective_history_tokens(rest, summary, clearings)


# --- the split ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """Where a summary cuts: ``older`` is summarized, ``recent`` stays in full."""

    older: tuple[Msg, ...]
    recent: tuple[Msg, ...]
    at_user: bool
    # Estimated tokens the summary may take so that it and the recent part leave the request
    # room to grow (set by the decision: ``core.decision.policy``); None: the setting's size.
    summary_room: int | None = None
    # The chat's last request as sent, built again by the run (``core.compression.prefix``):
    # the summarizer's request is built on it where it can be (``core.summaries.onprefix``).
    prefix: SentRequest | None = None

    @property
    def cutoff_message_id(self) -> int:
        """The last message the summary covers."""
        return self.older[-1].id


def message_tokens(message: Msg, clearings: Mapping[int, ClearingRec]) -> int:
    """A message's stored tokens, a cleared result counted at its placeholder size."""
    cleared = clearings.get(message.id)
    return message.tokens - (cleared.tokens_reclaimed if cleared is not None else 0)


def replaced_tokens(
    older: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    pinned: Collection[int] = frozenset(),
) -> int:
    """What a summary of ``older`` takes out of the request: their tokens, less the pinned
    ones, which are sent after the summary all the same (``core.request.pins``)."""
    return sum(message_tokens(m, clearings) for m in older if m.id not in pinned)


def _spanned(messages: Sequence[Msg]) -> list[bool]:
    """For each index, whether a call made before it is answered at or after it: a cut there
    would summarize the call and leave its result behind, where the request must drop it."""
    depth = [0] * (len(messages) + 1)
    calls: dict[str, list[int]] = {}
    for index, message in enumerate(messages):
        if message.role == "assistant":
            for call_id in message.tool_call_ids:
                calls.setdefault(call_id, []).append(index)
        elif message.role == "tool" and calls.get(message.tool_call_id or ""):
            made = calls[message.tool_call_id or ""].pop(0)
            depth[made + 1] += 1
            depth[index + 1] -= 1
    spanned, open_pairs = [], 0
    for index in range(len(messages)):
        open_pairs += depth[index]
        spanned.append(open_pairs > 0)
    return spanned


def _inside(messages: Sequence[Msg], attached: Sequence[tuple[int, int]]) -> set[int]:
    """Indices a cut may not fall before because it would split an attachment: after its open
    marker, up to its close marker (``core.request.attach``)."""
    if not attached:
        return set()
    index = {m.id: i for i, m in enumerate(messages)}
    inside: set[int] = set()
    for open_id, close_id in attached:
        start, end = index.get(open_id), index.get(close_id)
        if start is not None:
            inside.update(range(start + 1, (end if end is not None else len(messages) - 1) + 1))
    return inside


def _boundaries(
    messages: Sequence[Msg], attached: Sequence[tuple[int, int]] = ()
) -> tuple[list[int], list[int]]:
    """Indices a cut may fall before: user messages, and assistant steps with no open call;
    never between a call and its result, nor inside an attachment."""
    users: list[int] = []
    steps: list[int] = []
    open_calls: set[str] = set()
    substantive = False
    spanned = _spanned(messages)
    inside = _inside(messages, attached)
    for index, message in enumerate(messages):
        if index > 0 and substantive and not spanned[index] and index not in inside:
            if message.role == "user":
                users.append(index)
            elif message.role == "assistant" and not open_calls:
                steps.append(index)
        if message.role == "assistant":
            open_calls.update(message.tool_call_ids)
        elif message.role == "tool" and message.tool_call_id is not None:
            open_calls.discard(message.tool_call_id)
        elif message.role == "user":
            open_calls.clear()  # a call left unanswered before a new request stays unanswered
        substantive = substantive or message.role not in ("system", "developer")
    return users, steps


def plan_split(
    messages: Sequence[Msg],
    *,
    recent_budget: int,
    recent_cap: int,
    keep_turns: int = 0,
    clearings: Mapping[int, ClearingRec] | None = None,
    attached: Sequence[tuple[int, int]] = (),
) -> Split | None:
    """Cut the unsummarized messages into an older part and a recent part, or None when there is
    no older part to summarize.

    The cut falls just before a user message: the earliest whose suffix fits the recent budget
    (raised to hold the last ``keep_turns`` turns when they fit the cap), else the latest one
    within the cap. An agent run can be one user turn with a hundred tool calls, so when no user
    message qualifies the cut falls before an assistant step whose calls are all answered.
    A cut never falls inside an attachment (``attached``: its open and close marker ids): a
    summary covers an attachment whole or not at all.
    """
    cleared = clearings or {}
    sizes = [message_tokens(m, cleared) for m in messages]
    suffix = [0] * (len(messages) + 1)
    for index in range(len(messages) - 1, -1, -1):
        suffix[index] = suffix[index + 1] + sizes[index]
    users, steps = _boundaries(messages, attached)
    if not users and not steps:
        return None
    budget = recent_budget
    user_starts = [i for i, m in enumerate(messages) if m.role == "user"]
    if keep_turns > 0 and len(user_starts) >= keep_turns:
        turns = suffix[user_starts[-keep_turns]]
        if turns <= recent_cap:
            budget = max(budget, turns)
    cut = _choose_cut(users, steps, suffix, budget, recent_cap)
    return Split(
        older=tuple(messages[:cut]),
        recent=tuple(messages[cut:]),
        at_user=messages[cut].role == "user",
    )


def _choose_cut(
    users: list[int], steps: list[int], suffix: list[int], budget: int, cap: int
) -> int:
    fitting = [i for i in users if suffix[i] <= budget]
    if fitting:
        return min(fitting)
    within_cap = [i for i in users if suffix[i] <= cap]
    if within_cap:
        return max(within_cap)
    fitting_steps = [i for i in steps if suffix[i] <= budget]
    if fitting_steps:
        return min(fitting_steps)
    return max(users + steps)


# --- the summarizer's input --------------------------------------------------------------------


def trim_text(text: str, limit: int) -> str:
    """Head and tail of a long text with the middle replaced by a note of how much was cut."""
    if len(text) <= limit:
        return text
    keep = max(limit - 60, 20)
    head, tail = text[: keep * 2 // 3], text[-(keep // 3) :] if keep // 3 else ""
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters trimmed ...]\n{tail}"


def tool_names(messages: Sequence[Msg]) -> dict[str, str]:
    """The tool name of every call id made in ``messages``."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.tool_calls:
            function = call.get("function") or {}
            names[str(call.get("id", ""))] = str(function.get("name") or "tool")
    return names


def describe_calls(message: Msg, argument_chars: int = ARGUMENT_CHARS) -> str:
    """An assistant's tool calls as ``[Used tools: name(args), ...]``."""
    parts = []
    for call in message.tool_calls:
        function = call.get("function") or {}
        arguments = trim_text(str(function.get("arguments") or ""), argument_chars)
        parts.append(f"{function.get('name') or 'tool'}({arguments})")
    return f"[Used tools: {', '.join(parts)}]" if parts else ""


def render_message(
    message: Msg,
    *,
    names: Mapping[str, str],
    result_chars: int,
    cleared: bool = False,
) -> Rendered:
    """One stored message as plain text the summarizer reads (no tool roles: any provider takes it).

    Tool calls appear as ``[Used tools: name(args)]``, tool results as trimmed text under the
    tool's name, a cleared result as a note that it was cleared.
    """
    text = message.content or ""
    if message.content_parts:
        text = media.parts_text(message.content_parts)  # media as kind, name, size, caption
    if message.role == "tool":
        name = message.name or names.get(message.tool_call_id or "", "tool")
        body = "(output cleared earlier)" if cleared else trim_text(text, result_chars)
        return {"role": "user", "content": f"[Tool result of {name}]\n{body}"}
    if message.role == "assistant":
        calls = describe_calls(message)
        content = "\n".join(part for part in (text, calls) if part) or "(no text)"
        return {"role": "assistant", "content": content}
    if message.role in ("system", "developer"):
        return {"role": "user", "content": f"[System instructions]\n{text}"}
    return {"role": "user", "content": text or "(empty message)"}


def render_messages(
    messages: Sequence[Msg],
    *,
    names: Mapping[str, str],
    result_chars: int,
    clearings: Mapping[int, ClearingRec] | None = None,
) -> list[Rendered]:
    """``render_message`` over a run of messages."""
    cleared = clearings or {}
    return [
        render_message(m, names=names, result_chars=result_chars, cleared=m.id in cleared)
        for m in messages
    ]


def system_prompt(prompt: str, previous_summary: str | None) -> str:
    """The summary prompt with the previous summary (or a note that there is none) filled in."""
    if PREVIOUS_SUMMARY_PLACEHOLDER not in prompt:
        raise ValueError(f"the summary prompt must contain {PREVIOUS_SUMMARY_PLACEHOLDER}")
    return prompt.replace(PREVIOUS_SUMMARY_PLACEHOLDER, previous_summary or NO_PREVIOUS_SUMMARY)


def missing_within(missing: Sequence[str], limit: int, count: Counter) -> list[str]:
    """As many of the missing identifiers as fit in ``limit`` tokens, in order."""
    kept: list[str] = []
    used = 0
    for token in missing:
        size = count({"role": "", "content": f"- {token}"})
        if used + size > limit:
            break
        kept.append(token)
        used += size
    return kept


def build_summary_messages(
    *,
    prompt: str,
    previous_summary: str | None,
    older: Sequence[Rendered],
    recent: Sequence[Rendered],
    missing: Sequence[str] = (),
) -> list[Rendered]:
    """System prompt (with the previous summary), the older messages, the cutoff marker as its
    own user message, the recent messages as context only, and the reminder last."""
    reminder = SUMMARY_REMINDER
    if missing:
        reminder += "\n\n" + RETENTION_REMINDER + "\n" + "\n".join(f"- {m}" for m in missing)
    return [
        {"role": "system", "content": system_prompt(prompt, previous_summary)},
        *older,
        {"role": "user", "content": CUTOFF_MARKER},
        *recent,
        {"role": "user", "content": reminder},
    ]


@dataclass(frozen=True, slots=True)
class SummaryPlan:
    """The summarizer calls one summary takes: one chunk, or several each seeding the next."""

    chunks: tuple[tuple[Rendered, ...], ...]
    recent: tuple[Rendered, ...]
    input_budget: int
    max_output_tokens: int  # the reply's limit each call is sent with


class SummarizerWindowError(ValueError):
    """The summarizer's window cannot hold even one minimal chunk."""


def plan_summary(
    *,
    older: Sequence[Rendered],
    recent: Sequence[Rendered],
    prompt: str,
    previous_summary_tokens: int,
    window: int,
    max_output_tokens: int,
    count: Counter,
    chunk_share: float = 1.0,
) -> SummaryPlan:
    """Fit the summarizer's input into its window: one request when it fits, else chunks.

    ``chunk_share`` is the share of the room left beside the fixed parts that the recent context
    and a chunk may take: a summarizer whose model answered that its context is too long asks
    again with smaller chunks (the prompt, the previous summary and the output keep their room),
    and only a chunk below ``MIN_CHUNK_TOKENS`` cannot be sent.

    Each request holds the system prompt (with a previous summary of at most
    ``max(previous_summary_tokens, max_output_tokens)`` tokens), its chunk of older messages, the
    marker, the recent context (newest messages kept, at most a quarter of the input) and the
    reminder with room for a list of missing identifiers; the reply's ``max_output_tokens`` are
    kept free.
    """
    budget = int(window * (1 - SUMMARIZER_MARGIN)) - max_output_tokens
    fixed = (
        REQUEST_PRIMING_TOKENS
        + count({"role": "system", "content": system_prompt(prompt, "")})
        + max(previous_summary_tokens, max_output_tokens)
        + count({"role": "user", "content": CUTOFF_MARKER})
        + count({"role": "user", "content": SUMMARY_REMINDER + RETENTION_REMINDER})
        + RETENTION_LIST_TOKENS
    )
    room = budget - fixed
    if room < MIN_CHUNK_TOKENS:
        raise SummarizerWindowError(
            f"the summarizer's window ({window} tokens) cannot hold a request of its prompt, "
            f"the previous summary and {max_output_tokens} output tokens"
        )
    room = int(room * chunk_share)
    if room < MIN_CHUNK_TOKENS:
        raise SummarizerWindowError(
            f"the summarizer's model took no chunk of the {len(older)} messages: even chunks "
            f"of {MIN_CHUNK_TOKENS} tokens beside its prompt, the previous summary and "
            f"{max_output_tokens} output tokens were too long for it"
        )
    kept_recent = _newest_within(recent, int(room * RECENT_CONTEXT_SHARE), count)
    room -= sum(count(m) for m in kept_recent)
    chunks = _pack(older, room, count)
    chunked = tuple(tuple(c) for c in chunks)
    return SummaryPlan(chunked, tuple(kept_recent), budget, max_output_tokens)


def _newest_within(messages: Sequence[Rendered], limit: int, count: Counter) -> list[Rendered]:
    kept: list[Rendered] = []
    used = 0
    for message in reversed(messages):
        size = count(message)
        if used + size > limit:
            break
        kept.append(message)
        used += size
    kept.reverse()
    return kept


def _fit(message: Rendered, limit: int, count: Counter) -> Rendered:
    """A message cut to about ``limit`` tokens (it alone is bigger than a chunk)."""
    size = count(message)
    if size <= limit:
        return message
    chars = int(len(message["content"]) * limit / size * TRIM_SAFETY)
    fitted = {**message, "content": trim_text(message["content"], max(chars, 100))}
    while count(fitted) > limit and len(fitted["content"]) > 200:
        fitted = {**fitted, "content": trim_text(fitted["content"], len(fitted["content"]) // 2)}
    return fitted


def _pack(messages: Sequence[Rendered], room: int, count: Counter) -> list[list[Rendered]]:
    """Greedy chunks of consecutive messages, each within ``room`` tokens."""
    chunks: list[list[Rendered]] = [[]]
    used = 0
    for message in messages:
        fitted = _fit(message, room, count)
        size = count(fitted)
        if chunks[-1] and used + size > room:
            chunks.append([])
            used = 0
        chunks[-1].append(fitted)
        used += size
    return chunks if chunks[-1] else [[]]


# --- validation --------------------------------------------------------------------------------


def rejection_reason(text: str | None, *, summary_tokens: int, replaced_tokens: int) -> str | None:
    """Why a summary must not be stored (empty, error text, not smaller than what it replaces),
    or None when it may be."""
    if text is None or not text.strip():
        return "the summary is empty"
    if ERROR_TEXT_RE.search(text):
        first = text.strip().splitlines()[0][:80]
        return f"the summary reads as an error message ({first!r})"
    if summary_tokens >= replaced_tokens:
        return (
            f"the summary ({summary_tokens} tokens) {REJECTED_NOT_SMALLER} {replaced_tokens} "
            "tokens it would replace"
        )
    return None


def cooldown_until(
    failures: Sequence[datetime], *, streak: int, first_minutes: float
) -> datetime | None:
    """Until when the summarizer rests after a run of failures, or None when it may run now.

    ``failures`` holds the times of the conversation's failed runs since its last summary, newest
    first. Below ``streak`` of them nothing rests; at ``streak`` the summarizer waits
    ``first_minutes`` after the newest failure, and each further failure doubles the wait, up to
    ``COOLDOWN_MAX_FACTOR`` times. So a summarizer that keeps failing on one conversation (a
    rejected summary, a span it cannot fit, a revoked key) is not called on every turn.
    """
    if streak < 1 or len(failures) < streak:
        return None
    factor = min(2 ** (len(failures) - streak), COOLDOWN_MAX_FACTOR)
    return failures[0] + timedelta(minutes=first_minutes * factor)
