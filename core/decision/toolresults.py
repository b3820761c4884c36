"""Tool results (pure): previews of oversized outputs and arguments, and the clearing policy.

Truncation happens once, on the way in: an output over the line or byte limit keeps a preview in
its row (head and tail of the text, or the structure of a JSON search result) and a note saying
where the full text was saved. ``core.storage.outputs`` writes the file; everything here is string
work.

Clearing is a one-way state recorded beside a message: the request shows a fixed placeholder
instead of the output. Before that a result can be aged: sent as its head and tail within a
character cap (``core.request.shorten.aged_text``), the size it renders within fixed by the row
(``aged_tokens_bound``); an assistant message's old call arguments can be shortened
(``shortened_call``). ``plan_clearings`` decides which results of a branch to take one step
(full -> aged -> cleared, or full -> cleared) and which arguments to shorten; the ``clearings``
rows (one per message and stage) are written by ``core.storage.sweep.apply_clearings`` (one
conversation) or the batched ``core.storage.sweep`` sweep (every idle conversation at once).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from recap.core.counting import tokens
from recap.core.counting.tokens import TOKENS_PER_NAME
from recap.core.request.placeholders import (
    DEFAULT_TOOL_NAME,
    aged_note_frames,
    arguments_note,
    placeholder_frames,
)
from recap.core.request.refs import REF_VALUE_TOKENS, message_ref
from recap.core.values.records import AGED, ARGUMENTS, CLEARED, ClearingRec, Msg

# --- truncation --------------------------------------------------------------------------------

PREVIEW_SHARE = 0.2  # a preview keeps a fifth of the limits: 400 lines / 10 KB by default
HEAD_SHARE = (
    0.6  # of a preview, the head; the tail (where test logs put their errors) gets the rest
)
PREVIEW_MIN_BYTES = 512  # even with tiny limits a preview shows something useful
PREVIEW_MIN_LINES = 4
SNIPPET_CHARS = 200  # a search hit keeps this much of its snippet
FIELD_CHARS = 300  # an identity field (title, url, path) longer than this is clipped too
MAX_JSON_DEPTH = 3  # how deep a JSON preview looks for the list of hits
ARGUMENT_HEAD_SHARE = 0.7  # a trimmed argument keeps mostly its beginning

IDENTITY_KEYS = frozenset(
    {
        "id", "_id", "doc_id", "document_id", "key", "title", "name", "url", "link", "href",
        "uri", "path", "file", "filename", "source", "score", "_score", "rank", "relevance",
        "similarity", "distance", "date", "published", "type", "line", "line_number", "lineno",
    }
)  # fmt: skip
SNIPPET_KEYS = frozenset(
    {
        "snippet", "summary", "description", "text", "content", "body", "abstract", "excerpt",
        "highlight", "highlights", "preview", "message", "match", "context",
    }
)  # fmt: skip
HIT_LIST_KEYS = ("results", "items", "hits", "documents", "docs", "matches", "data", "entries")


@dataclass(frozen=True, slots=True)
class Limits:
    """When an output counts as oversized, and how large its preview may be."""

    max_lines: int
    max_bytes: int

    @property
    def preview_lines(self) -> int:
        return max(PREVIEW_MIN_LINES, int(self.max_lines * PREVIEW_SHARE))

    @property
    def preview_bytes(self) -> int:
        return max(PREVIEW_MIN_BYTES, int(self.max_bytes * PREVIEW_SHARE))


def byte_size(text: str) -> int:
    """UTF-8 size of a text."""
    return len(text.encode("utf-8"))


def line_count(text: str) -> int:
    """Lines of a text (a last line without a newline counts)."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def is_oversized(text: str, limits: Limits) -> bool:
    """Whether an output goes over the line or the byte limit."""
    return byte_size(text) > limits.max_bytes or line_count(text) > limits.max_lines


def output_preview(text: str, location: str, limits: Limits) -> str:
    """The preview stored instead of an oversized output: a note saying what was cut and where the
    full text is, then the JSON structure of a search-like result or the head and tail of the text.
    """
    size, lines = byte_size(text), line_count(text)
    structured = json_preview(text, limits.preview_bytes)
    if structured is not None:
        body, shown = structured
        what = f"showing {shown}"
    else:
        body, head_lines, tail_lines = head_tail(text, limits.preview_lines, limits.preview_bytes)
        what = f"showing the first {head_lines} and the last {tail_lines} lines"
    note = (
        f"[Output truncated: {size} bytes in {lines} lines; {what}. "
        f"The full output is saved at {location}; read that file for the rest.]"
    )
    return f"{note}\n{body}"


def head_tail(text: str, max_lines: int, max_bytes: int) -> tuple[str, int, int]:
    """The head and tail of a text within a line and byte budget, with a marker for the middle;
    returns the preview and how many lines of the head and of the tail it shows."""
    lines = text.splitlines(keepends=True)
    head_budget = (int(max_lines * HEAD_SHARE), int(max_bytes * HEAD_SHARE))
    tail_budget = (max_lines - head_budget[0], max_bytes - head_budget[1])
    head = _take(lines, *head_budget)
    rest = lines[len(head) :]
    tail = _take(rest[::-1], *tail_budget)[::-1]
    middle = rest[: len(rest) - len(tail)]
    partial = 0
    if not head and middle:  # a first line longer than the head budget: its start
        head, partial = [_clip_bytes(middle[0], head_budget[1])], partial + 1
    if not tail and middle:  # a last line longer than the tail budget: its end
        tail, partial = [_clip_bytes(middle[-1], tail_budget[1], from_end=True)], partial + 1
    shown = "".join(head) + "".join(tail)
    omitted_bytes = byte_size(text) - byte_size(shown)
    omitted_lines = max(len(middle) - partial, 0)
    marker = f"[... {omitted_lines} lines ({omitted_bytes} bytes) omitted ...]\n"
    head_text = "".join(head)
    if head_text and not head_text.endswith("\n"):
        head_text += "\n"
    return head_text + marker + "".join(tail), len(head), len(tail)


def _take(lines: Sequence[str], max_lines: int, max_bytes: int) -> list[str]:
    taken: list[str] = []
    used = 0
    for line in lines[:max_lines]:
        size = byte_size(line)
        if used + size > max_bytes:
            break
        taken.append(line)
        used += size
    return taken


def _clip_bytes(text: str, max_bytes: int, *, from_end: bool = False) -> str:
    """At most ``max_bytes`` of a text, cut on a character boundary."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    part = data[-max_bytes:] if from_end else data[:max_bytes]
    return part.decode("utf-8", errors="ignore")


def clip_chars(text: str, max_chars: int, head_share: float = ARGUMENT_HEAD_SHARE) -> str:
    """A text cut to about ``max_chars`` characters, keeping its start and end."""
    if len(text) <= max_chars:
        return text
    head = int(max_chars * head_share)
    tail = max_chars - head
    omitted = len(text) - head - tail
    return f"{text[:head]}[... {omitted} characters omitted ...]{text[len(text) - tail :]}"


# --- JSON previews -----------------------------------------------------------------------------


def json_preview(text: str, max_bytes: int) -> tuple[str, str] | None:
    """For a JSON result holding a list of hits (search, retrieval, listing tools): the same JSON
    with each hit cut to its identity fields and a short snippet, as many hits as fit
    ``max_bytes``. Returns the JSON text and what it shows, or None for any other output."""
    stripped = text.lstrip()
    if not stripped.startswith(("[", "{")):
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    found = _find_hits(document, (), 0)
    if found is None:
        return None
    path, hits = found
    shrunk = [_shrink_hit(hit) for hit in hits]
    kept = _fit_hits(document, path, shrunk, max_bytes)
    if kept == 0:
        return None
    body = _dump(_with_hits(document, path, shrunk[:kept]))
    where = "/".join(str(part) for part in path) or "the top-level list"
    return body, f"the first {kept} of {len(hits)} results of {where}, each cut to its key fields"


def _find_hits(
    node: Any, path: tuple[str, ...], depth: int
) -> tuple[tuple[str, ...], list[Any]] | None:
    """The longest list of JSON objects in the document (named hit lists preferred)."""
    if isinstance(node, list):
        if node and all(isinstance(item, dict) for item in node):
            return path, node
        return None
    if not isinstance(node, dict) or depth >= MAX_JSON_DEPTH:
        return None
    candidates = []
    for key, value in node.items():
        found = _find_hits(value, (*path, str(key)), depth + 1)
        if found is not None:
            candidates.append((key in HIT_LIST_KEYS, len(found[1]), found))
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c[0], c[1]))[2]


def _shrink_hit(hit: Mapping[str, Any]) -> dict[str, Any]:
    """A hit cut to its identity fields and short snippets (or short scalars when it has none)."""
    known = [key for key in hit if key in IDENTITY_KEYS or key in SNIPPET_KEYS]
    keys = known or list(hit)
    out: dict[str, Any] = {}
    for key in keys:
        value = hit[key]
        limit = SNIPPET_CHARS if key in SNIPPET_KEYS or not known else FIELD_CHARS
        if isinstance(value, str):
            out[key] = clip_chars(value, limit, head_share=1.0) if len(value) > limit else value
        elif value is None or isinstance(value, bool | int | float):
            out[key] = value
        elif key in SNIPPET_KEYS:
            out[key] = clip_chars(_dump(value), limit, head_share=1.0)
    return out


def _with_hits(document: Any, path: tuple[str, ...], hits: list[dict[str, Any]]) -> Any:
    """The document with the hit list replaced; sibling scalars kept, other bulk dropped."""
    if not path:
        return hits
    assert isinstance(document, dict)
    out: dict[str, Any] = {}
    for key, value in document.items():
        if key == path[0]:
            out[key] = _with_hits(value, path[1:], hits)
        elif value is None or isinstance(value, bool | int | float):
            out[key] = value
        elif isinstance(value, str):
            out[key] = clip_chars(value, FIELD_CHARS, head_share=1.0)
    return out


def _fit_hits(document: Any, path: tuple[str, ...], hits: list[dict[str, Any]], budget: int) -> int:
    """How many hits fit the byte budget (a binary search over the rendered size)."""
    low, high = 0, len(hits)
    while low < high:
        middle = (low + high + 1) // 2
        if byte_size(_dump(_with_hits(document, path, hits[:middle]))) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --- oversized arguments -----------------------------------------------------------------------


def trim_arguments(
    arguments: str, location: str, max_chars: int, *, note: str | None = None
) -> str | None:
    """Arguments of a tool call (a ``write_file``/``edit_file`` with a whole file in them) cut to
    about ``max_chars``: each long string field keeps its start and end and says where the full
    call was saved (or ``note``). Returns None when the arguments are within the limit."""
    if len(arguments) <= max_chars:
        return None
    if note is None:
        note = f" [full arguments saved at {location}]"
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        long_fields = [k for k, v in parsed.items() if isinstance(v, str) and len(v) > 64]
        if long_fields:
            share = max(max_chars // len(long_fields) - len(note), 64)
            trimmed = {
                key: clip_chars(value, share) + note if key in long_fields else value
                for key, value in parsed.items()
            }
            return _dump(trimmed)
    return clip_chars(arguments, max_chars) + note


# --- clearing ----------------------------------------------------------------------------------

IDLE = "idle"  # the conversation was idle past the provider's cache lifetime
POST_SUMMARY = "post_summary"  # a summary was just written, the cache is invalid anyway
PRESSURE = "pressure"  # over the trigger, and enough would be reclaimed
REASONS = (IDLE, POST_SUMMARY, PRESSURE)
VALUE_SLACK = 1  # a variable part may shift one token boundary of the fixed text around it


@dataclass(frozen=True, slots=True)
class PlannedClearing:
    """One step to record for a message: its stage, what the message's state after it saves
    against the stored count (the row's ``tokens_reclaimed``), and what the step itself saves
    (``gain``: less than that when the result was aged before; None: the same)."""

    message_id: int
    tokens_reclaimed: int
    stage: str = CLEARED
    gain: int | None = None
    kept_chars: int | None = None  # an aged result's character cap

    @property
    def saves(self) -> int:
        """Tokens the request sends fewer once this step is recorded."""
        return self.tokens_reclaimed if self.gain is None else self.gain


@dataclass(frozen=True, slots=True)
class ClearingPlan:
    """The steps to record in one conversation, in branch order; falsy when there are none."""

    reason: str
    items: tuple[PlannedClearing, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[PlannedClearing]:
        return iter(self.items)

    @property
    def message_ids(self) -> list[int]:
        return [item.message_id for item in self.items]

    @property
    def tokens_reclaimed(self) -> int:
        """What the plan saves, step by step (an aged result cleared saves the difference)."""
        return sum(item.saves for item in self.items)

    def count(self, stage: str) -> int:
        """Steps of one stage."""
        return sum(1 for item in self.items if item.stage == stage)

    def describe(self) -> str:
        """The plan in words, as a run's reason says it."""
        return describe_steps(
            self.count(CLEARED), self.count(AGED), self.count(ARGUMENTS), self.tokens_reclaimed
        )


def describe_steps(cleared: int, aged: int, arguments: int, tokens_reclaimed: int) -> str:
    """ "cleared 3 and aged 5 old tool results, shortened the arguments of 2 old calls (900
    tokens)": what a clearing did, every stage counted apart."""
    results = []
    if cleared:
        results.append(f"cleared {cleared}")
    if aged:
        results.append(f"aged {aged}")
    parts = [" and ".join(results) + " old tool results"] if results else []
    if arguments:
        parts.append(f"shortened the arguments of {arguments} old tool calls")
    return f"{', '.join(parts) or 'cleared 0 old tool results'} ({tokens_reclaimed} tokens)"


@lru_cache(maxsize=1)
def _frame_tokens() -> tuple[int, int]:
    """Tokens of the fixed placeholder text, without and with a saved path (either encoding)."""
    frames = placeholder_frames()
    counts = [
        [tokens.count_text(frame, encoding) for encoding in (tokens.O200K, tokens.CL100K)]
        for frame in frames
    ]
    without_path = max(counts[0])
    with_path = max(max(counts[1]), max(counts[2]))
    return without_path, with_path


def placeholder_base_tokens(has_path: bool) -> int:
    """The constant part of ``placeholder_tokens_bound`` (the SQL sweep uses the same numbers)."""
    without_path, with_path = _frame_tokens()
    frame = with_path if has_path else without_path
    role = max(tokens.count_short("tool", e) for e in (tokens.O200K, tokens.CL100K))
    # four variable parts (tool, call id, size, path), each allowed to shift one boundary, and
    # the recall reference's value (core.request.refs), bounded whatever the message id
    return tokens.TOKENS_PER_MESSAGE + role + frame + 4 * VALUE_SLACK + REF_VALUE_TOKENS


DIGIT_RUN_BOUNDS = (10**3, 10**6, 10**9)  # tiktoken splits digits into runs of three


def digit_tokens(number: int) -> int:
    """Tokens of a non-negative integer's digits (one per run of three digits)."""
    return 1 + sum(number >= bound for bound in DIGIT_RUN_BOUNDS)


def placeholder_tokens_bound(
    *, tool_name: str | None, call_id: str, tokens: int, output_path: str | None
) -> int:
    """An upper bound on the tokens of a cleared result's message (its placeholder content, role,
    name and call id), for either encoding, computed without a tokenizer: a token is at least one
    character, so a variable part costs at most its length. ``tokens_reclaimed`` is the stored
    count minus this bound: it never overstates what a clearing saves, and the SQL sweep computes
    the very same number (``core.storage.sweep``)."""
    total = placeholder_base_tokens(output_path is not None)
    total += digit_tokens(tokens) + 2 * len(call_id) + (len(output_path) if output_path else 0)
    if tool_name:  # named in the text and in the message's name field
        total += TOKENS_PER_NAME + 2 * len(tool_name)
    else:
        total += len(DEFAULT_TOOL_NAME)
    return total


def reclaimable(message: Msg) -> int:
    """Tokens clearing this result would save (zero or less: not worth clearing)."""
    bound = placeholder_tokens_bound(
        tool_name=message.name,
        call_id=message.tool_call_id or "",
        tokens=message.tokens,
        output_path=message.output_path,
    )
    return message.tokens - bound


# --- the aged stage ----------------------------------------------------------------------------

AGED_CHARS_PER_TOKEN = 4  # an aged result keeps at most a quarter as many tokens as characters
AGED_HEAD_SHARE = 0.6  # of an aged result, the head; the tail (errors, summaries) gets the rest
AGED_JOIN_SLACK = 4  # tokens the two cuts around the note can add (merges, a split character)
AGED_LEFT_TOKENS = 4  # the number of characters left out, at most (digit runs of up to 10**12)
ARGUMENT_AGED_CHARS = 200  # an old call's long arguments are shortened to about this much
ENCODINGS = (tokens.O200K, tokens.CL100K)


def aged_body_tokens(max_chars: int) -> int:
    """The most tokens an aged result keeps of its output (its head and tail together)."""
    return max(max_chars // AGED_CHARS_PER_TOKEN, 1)


@lru_cache(maxsize=1)
def _aged_frame_tokens() -> tuple[int, int]:
    """Tokens of the aged note's fixed text, without and with a saved path (either encoding)."""
    frames = aged_note_frames()
    counts = [max(tokens.count_text(frame, e) for e in ENCODINGS) for frame in frames]
    return counts[0], max(counts[1], counts[2])


def aged_tokens_bound(message: Msg, max_chars: int) -> int:
    """An upper bound on the tokens of an aged result's message (its head and tail within
    ``max_chars`` characters and ``aged_body_tokens`` tokens, the note, role, name and call id),
    for either encoding, without a tokenizer: what the aged step records (``tokens_reclaimed`` is
    the stored count minus it), and the size ``core.request.shorten.aged_text`` renders within."""
    without_path, with_path = _aged_frame_tokens()
    role = max(tokens.count_short("tool", e) for e in ENCODINGS)
    total = tokens.TOKENS_PER_MESSAGE + role + (with_path if message.output_path else without_path)
    total += 3 * VALUE_SLACK + REF_VALUE_TOKENS + AGED_LEFT_TOKENS + AGED_JOIN_SLACK
    total += 2 * len(message.tool_call_id or "") + len(message.output_path or "")
    if message.name:
        total += TOKENS_PER_NAME + 2 * len(message.name)
    return total + aged_body_tokens(max_chars)


def aged_reclaimable(message: Msg, max_chars: int) -> int:
    """Tokens ageing this result would save (zero or less: not worth ageing)."""
    return message.tokens - aged_tokens_bound(message, max_chars)


def shortened_call(call: Mapping[str, Any], ref: str) -> dict[str, Any]:
    """A tool call with its arguments shortened to about ``ARGUMENT_AGED_CHARS`` characters
    (``trim_arguments``: each long string field keeps its start and end), ending with a note
    naming ``ref``; the call itself when its arguments are short already."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str) or not _shortenable(arguments):
        return dict(call)
    short = trim_arguments(arguments, ref, ARGUMENT_AGED_CHARS, note=arguments_note(ref))
    if short is None:
        return dict(call)
    return {**call, "function": {**function, "arguments": short}}


def _shortenable(arguments: str) -> bool:
    """Whether shortening keeps the arguments what they were: JSON stays JSON (an object whose
    long string fields are cut), text stays text; other JSON is left whole."""
    if len(arguments) <= ARGUMENT_AGED_CHARS:
        return False
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return True
    return isinstance(parsed, dict) and any(
        isinstance(value, str) and len(value) > 64 for value in parsed.values()
    )


def argument_saving(message: Msg) -> int:
    """Tokens shortening the long arguments of the message's calls saves, in the encoding that
    saves the least (so the recorded saving never overstates what any request sends fewer)."""
    ref = message_ref(message.id)
    long = [
        call
        for call in message.tool_calls
        if len(str((call.get("function") or {}).get("arguments") or "")) > ARGUMENT_AGED_CHARS
    ]
    if not long:
        return 0
    return min(
        sum(
            tokens.count_tool_call(call, encoding)
            - tokens.count_tool_call(shortened_call(call, ref), encoding)
            for call in long
        )
        for encoding in ENCODINGS
    )


def tool_names(branch: Sequence[Msg]) -> dict[str, str]:
    """The tool name of every call made on the branch, by call id."""
    names: dict[str, str] = {}
    for message in branch:
        for call in message.tool_calls:
            function = call.get("function") or {}
            names[str(call.get("id", ""))] = str(function.get("name", ""))
    return names


def plan_clearings(
    branch: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    *,
    keep_last: int,
    protected: Collection[str],
    min_tokens: int,
    reason: str,
    pinned: Collection[int] = frozenset(),
    stage: str = CLEARED,
    aged_chars: int = 0,
    keep_arguments: int | None = None,
) -> ClearingPlan:
    """Which tool results of ``branch`` (the messages sent, after any summary's cutoff) to take
    one step further: to ``stage`` ``cleared`` (the placeholder) or ``aged`` (the head and tail
    within ``aged_chars`` characters).

    The candidates: every result but those of the last ``keep_last`` tool calls (calls, not user
    turns: an agent run can be one user turn with a hundred calls) and of ``protected`` tools
    (compared case-insensitively, by the result's name or else its call's). A step is one-way and
    must save tokens: a full result is aged when its aged form is smaller, cleared when its
    placeholder is; an aged result can only be cleared, and only when the placeholder is smaller
    still; a cleared (or shortened) one stays as it is. With ``keep_arguments`` (and ``aged_chars``
    set), the assistant messages whose calls are all older than the last ``keep_arguments`` calls
    also have their long arguments shortened (``ARGUMENT_AGED_CHARS``), unless a call is of a
    protected tool. ``pinned`` messages (results and calls) are sent as stored while pinned: no
    step for them (a pinned result still counts among the last ``keep_last``). The plan is empty
    unless it saves at least ``min_tokens`` in all. Deterministic: the same branch and clearings
    give the same plan.

    This is where every clearing of old results is chosen (the per-conversation decision, the
    clearing after a summary, the cost replays); the idle sweep's set-based SQL states the same
    rules (``core.storage.sweep``).
    """
    if reason not in REASONS:
        raise ValueError(f"unknown clearing reason {reason!r} (expected one of {REASONS})")
    if stage not in (AGED, CLEARED):
        raise ValueError(f"a result is aged or cleared, not {stage!r}")
    results = [m for m in branch if m.role == "tool"]
    older = results[: max(len(results) - keep_last, 0)]
    names = tool_names(branch)
    shielded = {name.lower() for name in protected}
    items = []
    for message in older:
        name = message.name or names.get(message.tool_call_id or "")
        if message.id in pinned or (name or "").lower() in shielded:
            continue
        item = _result_step(message, clearings.get(message.id), stage, aged_chars)
        if item is not None:
            items.append(item)
    if keep_arguments is not None and aged_chars > 0:
        items.extend(_argument_steps(branch, clearings, keep_arguments, shielded, pinned))
        items.sort(key=lambda item: item.message_id)  # ids grow along the branch
    plan = ClearingPlan(reason, tuple(items))
    if plan.tokens_reclaimed < max(min_tokens, 1):
        return ClearingPlan(reason)
    return plan


def _result_step(
    message: Msg, current: ClearingRec | None, stage: str, aged_chars: int
) -> PlannedClearing | None:
    """The one step ``stage`` takes this result, or None (nothing to gain, or not forward)."""
    if current is None and stage == AGED:
        saved = aged_reclaimable(message, aged_chars) if aged_chars > 0 else 0
        if saved <= 0:
            return None  # a small result stays full until it is cleared
        return PlannedClearing(message.id, saved, AGED, kept_chars=aged_chars)
    if current is None:
        saved = reclaimable(message)
        return PlannedClearing(message.id, saved) if saved > 0 else None
    if current.aged and stage == CLEARED:
        saved = reclaimable(message)
        gain = saved - current.tokens_reclaimed
        return PlannedClearing(message.id, saved, gain=gain) if gain > 0 else None
    return None  # cleared or shortened already, or aged already


def _argument_steps(
    branch: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    keep: int,
    shielded: Collection[str],
    pinned: Collection[int] = frozenset(),
) -> list[PlannedClearing]:
    """The assistant messages whose calls are all older than the last ``keep`` calls, with long
    arguments not shortened yet and no call of a protected tool: each message's shortening."""
    calling = [m for m in branch if m.role == "assistant" and m.tool_calls]
    left = sum(len(m.tool_calls) for m in calling) - keep  # calls older than the last ``keep``
    steps = []
    for message in calling:
        left -= len(message.tool_calls)
        if left < 0:
            break
        current = clearings.get(message.id)
        if message.id in pinned:
            continue
        if current is not None and (current.arguments_tokens or current.arguments_only):
            continue
        called = [(call.get("function") or {}).get("name") for call in message.tool_calls]
        if any(str(name or "").lower() in shielded for name in called):
            continue
        saved = argument_saving(message)
        if saved > 0:
            steps.append(PlannedClearing(message.id, saved, ARGUMENTS))
    return steps


def min_tokens_for(reason: str, clear_at_least_tokens: int) -> int:
    """The least a plan must reclaim: the setting under pressure (a smaller saving is not worth a
    cold cache), anything at all when the cache is cold already."""
    return clear_at_least_tokens if reason == PRESSURE else 1
