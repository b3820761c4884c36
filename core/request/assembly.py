"""The request view (pure): from a stored branch to the request the host sends its model.

``assemble`` takes three plain values: what is stored (``StoredBranch``: the branch, the summary
that applies to it, the clearings, the pinned messages), what the host asks for
(``core.values.request.RequestSpec``: its system prompt, tools, reminder, context files and
rendering) and the model with its limits (``Target``); it returns OpenAI-format messages with
their token breakdown. Nothing here reads a database or a file: ``core.service.assemble`` loads the
branch in one short session and calls it.

Stages: ``assemble`` runs ``STAGES`` in order over one draft (media ageing, units, reasoning
dropped, fixed parts, the tail, context files, older history, media finished with the byte guard,
reasoning sent, text-only merging, cache marks); each stage is a small function that reports its
own tokens in the draft's tally, and the breakdown is their sum.

Order of the request::

    system, [summary], older history, [context files, forgotten-file note],
    last user message, the tool calls and results after it, [reminder]

Tokens: the history uses the per-message counts stored at ingest (a cleared result counts as
``tokens - tokens_reclaimed``, as in ``core.request.branch.effective_history_tokens``); only the
parts built now (system prompt, summary message, tools, reminder, context files, stub results,
text-only turns) are counted, and those counts are cached by text.

Budget: ``budget = window x (1 - safety_margin)``. The fixed parts (system, tools, reminder, summary
and the reply priming) and the tail (the last user message and everything after it) must fit, else
``BudgetError``: the tail is never cut silently. Context files then take what they need, each one
kept or forgotten whole. Older history is added newest first and stops at the first unit that does
not fit, so what is kept is one contiguous newest run (a stable prefix keeps the prompt cache
useful). A unit is a message, or an assistant tool call with all its results: a call and its
results are kept or dropped together.

Tool pairs: every call gets exactly one result, placed right after the call's message (a result
stored later, after another message, is moved up to it); a call with no recorded result gets a
stub saying so; a result that answers no call on the sent branch (its call was summarized away, or
it repeats an answered call) is dropped and listed in ``dropped_message_ids``.

Pinned messages (``pinned``, see ``core.request.pins``) are fixed parts: sent in their place (their
unit is never left out or shortened, and no clearing applies to them), or right after the summary
once it covers them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from recap.core.counting import media, reasoning, tokens
from recap.core.decision.toolresults import shortened_call
from recap.core.errors import BudgetError, InputError
from recap.core.request import pins as pin_rules
from recap.core.request import refs, render, shorten
from recap.core.request.placeholders import cleared_placeholder
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.core.values.records import SYSTEM_ROLES, ClearingRec, Msg, SummaryRec
from recap.core.values.request import NO_PARTS, RequestSpec
from recap.core.values.request import ContextFile as ContextFile  # re-exported: hosts import it here

# The summary, context files, forgotten-file note and reminder are user messages: every provider
# accepts a user message anywhere, while a system message after the first is rejected by several
# chat templates and folded into the system prompt by others (which would move it out of order).
ADDED_ROLE = "user"
# A clearing of this reason records that an older assistant message's thinking is no longer sent
# (its turn ended), with the tokens that saves: decisions that read no content plan without it.
REASONING_CLEARING = "reasoning"
GAP_NOTE = "[Earlier messages of this conversation are left out here to fit the context window.]"
COUNT_CACHE_SIZE = 512  # distinct system prompts, summaries, reminders and files kept counted


@dataclass(frozen=True, slots=True)
class TokenBreakdown:
    """Tokens of each part of a request; ``total`` adds the reply priming to their sum."""

    system: int
    summary: int
    history: int
    context: int
    tools: int
    reminder: int
    total: int
    media: int = 0  # images, audio and files sent in full (not in ``history``)
    reasoning: int = 0  # reasoning and thinking content sent (not in ``history``)

    def as_dict(self) -> dict[str, int]:
        """The breakdown as the CLI prints it."""
        return {
            "system": self.system,
            "summary": self.summary,
            "history": self.history,
            "context": self.context,
            "tools": self.tools,
            "reminder": self.reminder,
            "media": self.media,
            "reasoning": self.reasoning,
            "total": self.total,
        }


@dataclass(frozen=True, slots=True)
class AssembledRequest:
    """The request to send now, and what was left out of it."""

    messages: list[dict[str, Any]]
    tokens: TokenBreakdown
    budget: int
    window: int
    summary_id: int | None
    dropped_message_ids: list[int]
    forgotten_files: list[str]
    # Messages whose media all aged in this request: (id, tokens reclaimed), to record as
    # ``media`` clearings so they stay aged (one-way).
    media_aged: tuple[tuple[int, int], ...] = ()
    truncated: bool = False  # older history was left out to fit the budget (never silently)
    truncated_tokens: int = 0  # stored tokens of the older messages left out (as far as read)
    # Older assistant messages whose thinking this request no longer sends: (id, tokens), to
    # record as ``reasoning`` clearings so that decisions without content plan without them.
    reasoning_dropped: tuple[tuple[int, int], ...] = ()
    # Tool results of the newest step sent as their head and tail because they could not fit
    # whole: (id, tokens reclaimed), to record as ``shortened`` clearings (one-way, same bytes).
    shortened: tuple[tuple[int, int], ...] = ()
    # The tail did not fit whole (results shortened or steps left out): a caller that left
    # rows unread on the assumption that it does (``omittable``) reads the whole branch again.
    fitted_tail: bool = False
    # The room the reply may take (the window less the request in provider tokens, capped by
    # the model's maximum output); set by ``core.service.assemble``, which knows the calibration.
    max_output_tokens: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``recap assemble --json``."""
        return {
            "messages": self.messages,
            "tokens": self.tokens.as_dict(),
            "budget": self.budget,
            "window": self.window,
            "summary_id": self.summary_id,
            "dropped_message_ids": self.dropped_message_ids,
            "forgotten_files": self.forgotten_files,
            "truncated": self.truncated,
        } | (
            {} if self.max_output_tokens is None else {"max_output_tokens": self.max_output_tokens}
        )


@dataclass(slots=True)
class _Unit:
    """One indivisible piece of history: a message, or a tool call with all its results."""

    items: list[Msg | dict[str, Any]]  # stored messages are rendered only if the unit is kept
    ids: list[int]
    tokens: int
    is_user: bool
    pinned: bool = False  # it holds a pinned message: always sent, counted as a fixed part


@lru_cache(maxsize=COUNT_CACHE_SIZE)
def _count(role: str, text: str, encoding: str) -> int:
    return tokens.count_message({"role": role, "content": text}, encoding)


@lru_cache(maxsize=COUNT_CACHE_SIZE)
def _count_tools(schema_text: str, encoding: str) -> int:
    return tokens.count_tools(json.loads(schema_text), encoding)


@dataclass(frozen=True, slots=True)
class Target:
    """The model a request is for and the limits it must keep: ``window`` tokens less the
    ``safety_margin``, or ``budget`` (estimated tokens) when the caller worked it out
    (``core.counting.budget``: output reserve and calibration included), and what of its media
    is sent in full (``media_policy``, see ``core.counting.media``; default: the defaults)."""

    model: str
    window: int
    safety_margin: float
    budget: int | None = None
    media_policy: media.MediaPolicy | None = None

    def __post_init__(self) -> None:
        """Refuse a window or a margin no request can be built within."""
        if self.window <= 0:
            raise InputError(f"the window must be a positive number of tokens, got {self.window}")
        if not 0 <= self.safety_margin < 1:
            raise InputError(f"the safety margin must be in [0, 1), got {self.safety_margin}")


@dataclass(frozen=True, slots=True)
class StoredBranch:
    """What the store holds for one branch (copied out by ``core.storage.reads``): the messages
    root first, the summary that applies, the clearings, the pinned messages (root first), the
    ids of the oldest messages the caller left unread because no request can hold them
    (``omittable``) and the saved output files that no longer exist."""

    branch: Sequence[Msg]
    summary: SummaryRec | None = None
    clearings: Mapping[int, ClearingRec] | None = None
    pinned: Sequence[Msg] = ()
    omitted: Sequence[int] = ()
    missing_outputs: Collection[str] = frozenset()


@dataclass(slots=True)
class _Tally:
    """The request's tokens as the stages report them; the breakdown adds them up at the end.

    ``history`` holds what the stages after the fit change in the history's count (media
    finished, reasoning counted apart, turns merged, cache marks); the fitted history itself
    is read from the fit (``_Draft.fitted_tokens``)."""

    system: int = 0
    summary: int = 0
    reminder: int = 0
    tools: int = 0
    pinned: int = 0  # pinned messages: history, but fitted as a fixed part
    context: int = 0
    history: int = 0
    media: int = 0
    reasoning: int = 0

    @property
    def fixed(self) -> int:
        """The parts fitted before any history, with the reply priming."""
        fixed = self.system + self.summary + self.reminder + self.tools + self.pinned
        return fixed + tokens.TOKENS_REPLY_PRIMING


@dataclass(slots=True)
class _Draft:
    """The request as the stages build it: what they were given, and what each has made."""

    stored: StoredBranch
    request: RequestSpec
    target: Target
    encoding: str
    family: str  # what reasoning the provider takes back (core.counting.reasoning)
    pins: frozenset[int]
    cleared: Mapping[int, ClearingRec]
    policy: media.MediaPolicy
    budget: int
    branch: Sequence[Msg]
    root: Msg | None
    tally: _Tally = field(default_factory=_Tally)
    system_message: dict[str, Any] | None = None
    summary_message: dict[str, Any] | None = None
    reminder_message: dict[str, Any] | None = None
    after: Sequence[Msg] = ()
    older: list[_Unit] = field(default_factory=list)
    tail: list[_Unit] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)
    repeated_call_ids: bool = False
    block: list[dict[str, Any]] = field(default_factory=list)  # pinned messages a summary covers
    media_aged: tuple[tuple[int, int], ...] = ()
    reasoning_dropped: tuple[tuple[int, int], ...] = ()
    shortened: tuple[tuple[int, int], ...] = ()
    cut_steps: list[int] = field(default_factory=list)
    fitted_tail: bool = False
    summary_cut: bool = False
    tail_tokens: int = 0
    room: int = 0
    context: list[dict[str, Any]] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    parts: _Parts | None = None
    fitted: _Fitted | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, stored: StoredBranch, request: RequestSpec, target: Target) -> _Draft:
        """The draft before any stage: the tokenizer, the pins, the clearings that apply to
        unpinned messages, the media policy and the budget."""
        model = target.model
        pins = frozenset(m.id for m in stored.pinned)
        return cls(
            stored=stored,
            request=request,
            target=target,
            encoding=tokens.encoding_name_for(model),
            family=reasoning.family_of(model),
            pins=pins,
            cleared=pin_rules.effective_clearings(stored.clearings or {}, pins),
            policy=target.media_policy or media.MediaPolicy(),
            budget=(
                tokens.available_tokens(target.window, target.safety_margin)
                if target.budget is None
                else target.budget
            ),
            branch=stored.branch,
            root=stored_prompt(stored.branch),
        )

    def fitted_tokens(self) -> int:
        """The history as fitted: the tail, the gap note, the kept older units and the tokens
        fresh call ids add."""
        assert self.fitted is not None
        fitted = self.fitted
        return self.tail_tokens + fitted.gap_tokens + fitted.kept_tokens + fitted.renamed

    def tail_error(self, tail_tokens: int) -> BudgetError:
        """The error for a tail of ``tail_tokens`` that the fixed parts leave no room for."""
        target = self.target
        return _tail_error(
            tail_tokens, self.tally.fixed, self.budget, target.window, target.safety_margin
        )


Stage = Callable[[_Draft], None]  # one step of ``assemble``: reads the draft, adds to it


def assemble(
    stored: StoredBranch, request: RequestSpec = NO_PARTS, *, target: Target
) -> AssembledRequest:
    """The request for ``stored.branch`` (root first) that ``request`` asks for, within
    ``target``'s window of its model.

    The system prompt is ``request.system`` when given; otherwise the branch's root message (no
    parent) when it is a stored ``system`` (or ``developer``) message, sent even when a summary
    covers it, since the summary replaces the conversation, not its instructions. A given
    ``system`` replaces the stored root prompt. Any other stored system message stays in place
    as history. ``request.model``, ``max_input_tokens`` and ``as_of`` were resolved by the
    caller into ``target`` and ``stored``; they are not read here.

    The summary is sent as a user message right after the system prompt: it is a record of the
    conversation rather than an operator instruction, it keeps the system prompt byte-stable
    across summaries, and it gives providers that require the first turn to be a user turn one.

    ``stored.missing_outputs`` lists the saved output files that no longer exist, so the
    placeholder of a cleared result can say so; ``text_only`` renders tool turns as plain text;
    ``cache_breakpoints`` adds Anthropic-style cache marks (``_mark_cache``: the stable prefix and
    the newest messages, at most four); None (the default) marks for Anthropic models only.

    ``stored.omitted`` lists the oldest messages after the cutoff that the caller left out of
    the branch because no request within the window can hold them (see ``omittable``): the
    request is the same as with them passed, and they are reported as dropped.

    Media (``target.media_policy``, see ``core.counting.media``): parts older than the last
    ``keep_turns`` user turns, of a message recorded as aged, beyond the per-request caps, or in
    a text-only request are sent as placeholders; the byte guard then ages the oldest parts
    still sent in full until the request is within ``max_request_bytes``, and stored bytes are
    put back by its loader. Messages whose media all aged here are listed in ``media_aged``, to
    be recorded.

    ``stored.pinned`` lists the branch's pinned messages, root first (``core.request.pins``):
    those after the cutoff are sent in their place whatever the budget (with their units), the
    others right after the summary; all of them as stored, and counted before any history is
    fitted.

    The request is built by ``STAGES`` in turn, each a small function over one draft that
    reports its own tokens in the draft's tally.
    """
    draft = _Draft.start(stored, request, target)
    for stage in STAGES:
        stage(draft)
    return _result(draft)


def _age_media_stage(d: _Draft) -> None:
    """Media: aged parts as placeholders, messages with media counted anew; the messages whose
    media all aged now, with the tokens that saves (``media_aged``)."""
    d.branch, d.root, d.media_aged = _age_media(
        d.branch,
        d.root,
        d.stored.summary,
        d.cleared,
        d.policy,
        model=d.target.model,
        text_only=d.request.text_only,
        pins=d.pins,
    )


def _units_stage(d: _Draft) -> None:
    """The system prompt, the messages after the cutoff as units with valid tool pairs, and
    where the tail (the last user message on) starts."""
    d.system_message, d.tally.system = _system_part(d.root, d.request.system, d.encoding)
    summary = d.stored.summary
    d.after = _after_cutoff(d.branch[1:] if d.root is not None else d.branch, summary, d.root)
    if not d.after and summary is None:
        raise InputError("nothing to send: the branch has no message besides a system prompt")
    units, d.orphans, d.repeated_call_ids = _units(
        d.after,
        d.cleared,
        d.stored.missing_outputs,
        d.encoding,
        text_only=d.request.text_only,
        pins=d.pins,
    )
    if d.pins:
        for unit in units:
            unit.pinned = any(mid in d.pins for mid in unit.ids)
    split = _last_user_unit(units)
    d.older, d.tail = units[:split], units[split:]


def _drop_reasoning_stage(d: _Draft) -> None:
    """Reasoning: the thinking this request does not send taken out of the units' counts; the
    older messages whose thinking is left out, with its tokens (``reasoning_dropped``)."""
    d.reasoning_dropped = _drop_reasoning(
        d.older,
        d.tail,
        d.cleared,
        d.family,
        model=d.target.model,
        text_only=d.request.text_only,
    )


def _fixed_stage(d: _Draft) -> None:
    """The fixed parts: the pinned messages (those a summary covers as a block after it), the
    summary, the reminder and the tools."""
    if d.pins:
        root = d.root
        placed = {m.id for m in d.after} | ({root.id} if root is not None else set())
        pinned = pin_rules.summarized(d.stored.pinned, placed)
        d.block = pin_rules.block(pinned, d.family, text_only=d.request.text_only)
    count = tokens.count_message
    d.tally.pinned = sum(count(m, d.encoding, model=d.target.model) for m in d.block)
    d.tally.pinned += sum(unit.tokens for unit in d.older if unit.pinned)
    d.summary_message, d.tally.summary = _summary_part(d.stored.summary, d.encoding)
    reminder = d.request.reminder
    d.reminder_message = {"role": ADDED_ROLE, "content": reminder} if reminder else None
    d.tally.reminder = _count(ADDED_ROLE, reminder, d.encoding) if reminder else 0
    d.tally.tools = _tools_tokens(d.request.tools, d.encoding)


def _fit_tail_stage(d: _Draft) -> None:
    """The tail within what the fixed parts leave (``_fit_tail``), the summary shortened first
    when the whole would crowd the newest turn out, and cut to its note when the tail still
    does not fit; else a ``BudgetError``."""
    tally = d.tally
    if d.summary_message is not None and tally.fixed + _tokens_of(d.tail) > d.budget:
        room = d.budget - tally.fixed + tally.summary
        d.summary_message, cut_tokens = _shortened_summary(
            d.summary_message, tally.summary, room, d.tail, d.encoding
        )
        d.summary_cut = cut_tokens < tally.summary
        tally.summary = cut_tokens
    d.tail, cut_older, d.cleared, d.shortened, d.cut_steps = _fit_tail(
        d.tail, d.budget - tally.fixed, d.cleared, d.encoding, d.pins
    )
    d.older.extend(cut_older)
    d.fitted_tail = bool(d.shortened or cut_older or d.cut_steps)
    d.tail_tokens = _tokens_of(d.tail)
    if tally.fixed + d.tail_tokens > d.budget and d.summary_message is not None:
        keep = d.budget - (tally.fixed - tally.summary) - d.tail_tokens
        if keep > 0:  # down to its note alone: the request says the summary was cut
            d.summary_message, tally.summary = _summary_cut_to(d.summary_message, keep, d.encoding)
            d.summary_cut = True
    if tally.fixed + d.tail_tokens > d.budget:
        raise d.tail_error(d.tail_tokens)
    d.room = d.budget - tally.fixed - d.tail_tokens


def _context_stage(d: _Draft) -> None:
    """The context files that fit what the tail leaves, each whole; no history from before the
    turn when the turn's own steps did not all fit."""
    d.context, d.tally.context, d.forgotten = _fit_context(
        d.request.context_files, d.room, d.encoding
    )
    d.room -= d.tally.context
    if d.cut_steps:
        d.room = 0


def _history_stage(d: _Draft) -> None:
    """The newest run of older units that fits the room left (``_fit_history``)."""
    d.parts = _Parts(
        d.context,
        d.tail,
        d.cleared,
        d.stored.missing_outputs,
        d.encoding,
        d.repeated_call_ids,
        d.family,
        d.request.text_only,
        d.pins,
    )
    d.fitted = _fit_history(d.older, d.room, d.parts, cut=bool(d.stored.omitted))
    if d.tally.fixed + d.fitted_tokens() + d.tally.context > d.budget:  # fresh call ids did it
        raise d.tail_error(d.tail_tokens + d.fitted.renamed)


def _finish_media_stage(d: _Draft) -> None:
    """Media sent in full, counted apart (``tally.media``); the byte guard ages the oldest
    parts first, then leaves the oldest kept history out (``_shed_bytes``)."""
    assert d.fitted is not None and d.parts is not None
    finished = _finished(d)
    excess = _bytes_over(finished.messages, d.policy.max_request_bytes)
    if excess > 0 and d.fitted.kept_from < len(d.older):  # media aged first; then older history
        d.fitted = _shed_bytes(d.older, d.fitted, d.parts, excess)
        finished = _finished(d)
    d.messages = finished.messages
    d.tally.media = finished.media_tokens
    d.tally.history += finished.tokens_delta - finished.media_tokens


def _finished(d: _Draft) -> media.Finished:
    """The whole request with its media finished (``media.finish``), pinned messages last to
    age."""
    assert d.fitted is not None
    ends = (d.system_message, d.summary_message, d.reminder_message)
    held = _pinned_positions(ends, d.fitted, d.block)
    whole = _whole(ends, d.fitted, d.block)
    counter = _media_counter(d.target.model)
    return media.finish(whole, d.policy, model=d.target.model, count=counter, keep=held)


def _sent_reasoning_stage(d: _Draft) -> None:
    """Reasoning sent, counted apart (``tally.reasoning``)."""
    sent = sum(tokens.count_reasoning(m, d.encoding) for m in d.messages)
    d.tally.reasoning = sent
    d.tally.history -= sent


def _alternate_stage(d: _Draft) -> None:
    """A text-only request merges neighbouring turns of one role (``_alternate``)."""
    if d.request.text_only:
        d.tally.history += _alternate(d.messages, d.encoding)


def _cache_marks_stage(d: _Draft) -> None:
    """Cache marks, when asked for (by default for Anthropic models, not text-only)."""
    marks = d.request.cache_breakpoints
    if marks is None:
        marks = d.family == reasoning.ANTHROPIC and not d.request.text_only
    if marks:
        d.tally.history += _mark_cache(
            d.messages,
            d.system_message is not None,
            d.summary_message is not None,
            d.reminder_message is not None,
            d.encoding,
            len(d.block),
        )


STAGES: tuple[Stage, ...] = (
    _age_media_stage,
    _units_stage,
    _drop_reasoning_stage,
    _fixed_stage,
    _fit_tail_stage,
    _context_stage,
    _history_stage,
    _finish_media_stage,
    _sent_reasoning_stage,
    _alternate_stage,
    _cache_marks_stage,
)
"""The stages of ``assemble``, in order; each reads and extends one ``_Draft``."""


def _result(d: _Draft) -> AssembledRequest:
    """The request the stages built, with its breakdown and what it left out."""
    assert d.fitted is not None
    tally, kept_from, summary = d.tally, d.fitted.kept_from, d.stored.summary
    left_out = [unit for unit in d.older[:kept_from] if not unit.pinned]
    older_dropped = (mid for unit in left_out for mid in unit.ids)
    dropped = sorted([*d.stored.omitted, *d.orphans, *older_dropped, *d.cut_steps])
    history = d.fitted_tokens() + tally.history + tally.pinned  # pinned ones are history
    breakdown = TokenBreakdown(
        system=tally.system,
        summary=tally.summary,
        history=history,
        context=tally.context,
        tools=tally.tools,
        reminder=tally.reminder,
        media=tally.media,
        reasoning=tally.reasoning,
        total=tally.fixed + history - tally.pinned + tally.context + tally.media + tally.reasoning,
    )
    return AssembledRequest(
        messages=d.messages,
        tokens=breakdown,
        budget=d.budget,
        window=d.target.window,
        summary_id=summary.id if summary is not None else None,
        dropped_message_ids=dropped,
        forgotten_files=d.forgotten,
        media_aged=d.media_aged,
        truncated=bool(d.stored.omitted) or kept_from > 0 or bool(d.cut_steps) or d.summary_cut,
        truncated_tokens=sum(unit.tokens for unit in left_out),
        reasoning_dropped=d.reasoning_dropped,
        shortened=d.shortened,
        fitted_tail=d.fitted_tail,
    )


def _tokens_of(units: Sequence[_Unit]) -> int:
    return sum(unit.tokens for unit in units)


def fixed_part_tokens(
    branch: Sequence[Msg], request: RequestSpec, *, model: str
) -> tuple[int, int, int, int]:
    """Tokens of the system prompt (the request's, else the stored root), the tools, the
    reminder and all the context files the request gives, counted as ``assemble`` counts them
    (cached): the request profile records them even for a request that does not fit."""
    encoding = tokens.encoding_name_for(model)
    _, system_tokens = _system_part(stored_prompt(branch), request.system, encoding)
    reminder = request.reminder
    reminder_tokens = _count(ADDED_ROLE, reminder, encoding) if reminder else 0
    files = sum(
        _count(ADDED_ROLE, _context_message(f)["content"], encoding) for f in request.context_files
    )
    return system_tokens, _tools_tokens(request.tools, encoding), reminder_tokens, files


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


def _age_media(
    branch: Sequence[Msg],
    root: Msg | None,
    summary: SummaryRec | None,
    cleared: Mapping[int, ClearingRec],
    policy: media.MediaPolicy,
    *,
    model: str,
    text_only: bool,
    pins: Collection[int] = frozenset(),
) -> tuple[Sequence[Msg], Msg | None, tuple[tuple[int, int], ...]]:
    """The branch with aged media parts as placeholders and every message with media counted
    anew for ``model``; the root prompt's media ages once a summary covers it. Also the
    messages whose media all aged now, not recorded yet, with the tokens that saves. A pinned
    message's media never ages."""
    if not any(m.content_parts and media.has_media(m.content_parts) for m in branch):
        return branch, root, ()
    after = _after_cutoff(branch[1:] if root is not None else branch, summary, root)
    recorded = {mid for mid, c in cleared.items() if c.reason == media.RECORDED}
    considered = [root, *after] if root is not None else list(after)
    plan = media.plan_ageing(
        considered, policy=policy, model=model, recorded=recorded, text_only=text_only
    )
    aged = dict(plan.aged)
    if root is not None and summary is not None:
        aged[root.id] = frozenset(media.media_positions(root.content_parts))
    encoding = tokens.encoding_name_for(model)
    out: list[Msg] = []
    new_records: list[tuple[int, int]] = []
    for message in branch:
        positions = media.media_positions(message.content_parts)
        clearing = cleared.get(message.id)
        if not positions or (
            clearing is not None
            and clearing.reason != media.RECORDED
            and not clearing.arguments_only  # shortened arguments leave the content as stored
        ):
            out.append(message)
            continue
        ageing = () if message.id in pins else aged.get(message.id, ())
        parts = media.age_parts(message.content_parts or (), ageing)
        changed = message._replace(content_parts=parts)
        changed = changed._replace(
            tokens=tokens.count_message(changed.to_openai(), encoding, model=model)
        )
        out.append(changed)
        whole = set(ageing) == set(positions)
        if (
            whole
            and message is not root
            and message.role != "tool"
            and message.id not in recorded
            and plan.reasons.get(message.id) in (media.TURNS, media.CAP)
        ):
            new_records.append((message.id, max(message.tokens - changed.tokens, 0)))
    new_root = out[0] if root is not None else None
    return out, new_root, tuple(new_records)


def _media_counter(model: str) -> media.Counter:
    encoding = tokens.encoding_name_for(model)
    return lambda message: tokens.count_message(message, encoding, model=model)


def stored_prompt(branch: Sequence[Msg]) -> Msg | None:
    """The branch's stored system prompt: its root message, when that is a system message."""
    if branch and branch[0].parent_id is None and branch[0].role in SYSTEM_ROLES:
        return branch[0]
    return None


def _system_part(
    root: Msg | None, system: str | None, encoding: str
) -> tuple[dict[str, Any] | None, int]:
    """The system message and its tokens: the given prompt, else the stored one."""
    if system:
        return {"role": "system", "content": system}, _count("system", system, encoding)
    if root is not None:
        return root.to_openai(), root.tokens
    return None, 0


def _after_cutoff(
    messages: Sequence[Msg], summary: SummaryRec | None, root: Msg | None
) -> Sequence[Msg]:
    """The messages a summary does not cover (all of them without one)."""
    if summary is None or (root is not None and root.id == summary.cutoff_message_id):
        return messages
    for index, message in enumerate(messages):
        if message.id == summary.cutoff_message_id:
            return messages[index + 1 :]
    raise InputError(
        f"summary {summary.id} covers message {summary.cutoff_message_id}, "
        "which is not on this branch"
    )


def _summary_part(summary: SummaryRec | None, encoding: str) -> tuple[dict[str, Any] | None, int]:
    if summary is None:
        return None, 0
    text = SUMMARY_MESSAGE_PREFIX + summary.text + refs.summary_note(summary.cutoff_message_id)
    return {"role": ADDED_ROLE, "content": text}, _count(ADDED_ROLE, text, encoding)


def _tools_tokens(tools: Sequence[Mapping[str, Any]] | None, encoding: str) -> int:
    if not tools:
        return 0
    schema_text = json.dumps(list(tools), sort_keys=True, separators=(",", ":"))
    return _count_tools(schema_text, encoding)


def _units(
    messages: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    missing_outputs: Collection[str],
    encoding: str,
    *,
    text_only: bool,
    pins: Collection[int] = frozenset(),
) -> tuple[list[_Unit], list[int], bool]:
    """The history as units with valid tool pairs, the ids of orphan results dropped, and
    whether any call id is used twice (only then are ids made unique: ``unique_call_ids``).
    A pinned orphan result is not dropped: it is sent in its place as its text-only form.

    This runs over every message after the cutoff on each request, so it stays a flat loop.
    """
    results: dict[str, list[int]] = {}
    for index, message in enumerate(messages):
        if message.role == "tool":
            results.setdefault(message.tool_call_id or "", []).append(index)
    used: set[int] = set()
    units: list[_Unit] = []
    orphans: list[int] = []
    call_ids: set[str] = set()
    calls = 0
    for index, message in enumerate(messages):
        role = message.role
        if role == "tool":
            if index in used:
                continue
            if message.id in pins:  # no call to answer: sent as text, as after a summary
                text = render.text_only_results([message.to_openai()])
                count = tokens.count_message(text, encoding)
                units.append(_Unit([text], [message.id], count, False, pinned=True))
            else:
                orphans.append(message.id)
        elif role == "assistant" and message.tool_calls:
            calls += len(message.tool_calls)
            answers, stubs = _answers(index, message, results, used, call_ids)
            stored = [messages[j] for j in answers]
            unit = _group_unit(message, stored, stubs, clearings, encoding)
            if text_only:
                unit = _text_only_unit(unit, clearings, missing_outputs, encoding)
            units.append(unit)
        else:
            units.append(_Unit([message], [message.id], message.tokens, role == "user"))
    return units, orphans, len(call_ids) < calls


def _answers(
    index: int, message: Msg, results: dict[str, list[int]], used: set[int], seen: set[str]
) -> tuple[list[int], list[dict[str, Any]]]:
    """For each call of ``message``: the first unused stored result after it, or a stub. The
    call ids go into ``seen``."""
    answers: list[int] = []
    stubs: list[dict[str, Any]] = []
    for call in message.tool_calls:
        call_id = str(call.get("id", ""))
        seen.add(call_id)
        for j in results.get(call_id, ()):
            if j > index and j not in used:
                used.add(j)
                answers.append(j)
                break
        else:
            stubs.append(render.stub_result(call))
    if len(answers) > 1:
        answers.sort()  # stored order, not call order
    return answers, stubs


def _group_unit(
    message: Msg,
    stored: list[Msg],
    stubs: list[dict[str, Any]],
    clearings: Mapping[int, ClearingRec],
    encoding: str,
) -> _Unit:
    """A call with its results: stored counts (cleared ones at placeholder size, aged ones at
    their recorded size, shortened arguments taken off) plus stubs."""
    calling = clearings.get(message.id)
    count = message.tokens - (calling.arguments_tokens if calling is not None else 0)
    ids = [message.id]
    for result in stored:
        ids.append(result.id)
        cleared = clearings.get(result.id)
        count += result.tokens - (cleared.tokens_reclaimed if cleared is not None else 0)
    items: list[Msg | dict[str, Any]] = [message, *stored]
    for stub in stubs:
        items.append(stub)
        count += tokens.count_message(stub, encoding)
    return _Unit(items, ids, count, False)


def _text_only_unit(
    unit: _Unit,
    clearings: Mapping[int, ClearingRec],
    missing_outputs: Collection[str],
    encoding: str,
) -> _Unit:
    """The same call group as two plain turns, counted as they will be sent."""
    rendered = [_render(item, clearings, missing_outputs, encoding) for item in unit.items]
    turns = [render.text_only_call(rendered[0]), render.text_only_results(rendered[1:])]
    count = sum(tokens.count_message(turn, encoding) for turn in turns)
    return _Unit(list(turns), unit.ids, count, False)


def _last_user_unit(units: Sequence[_Unit]) -> int:
    """Where the tail starts: the last user message (the whole history when there is none)."""
    for position in range(len(units) - 1, -1, -1):
        if units[position].is_user:
            return position
    return 0


def _fit_older(older: Sequence[_Unit], room: int, encoding: str, *, cut: bool) -> tuple[int, int]:
    """Where the kept older history starts, and the tokens of the gap note (0 when none).

    When older messages are left out (``cut``: some were already omitted by the caller), a short
    note says so where they were: the model learns that the history has a gap, and the first
    turn after the system prompt is a user turn.
    """
    start = _kept_from(older, room)
    if start == 0 and not cut:
        return 0, 0
    gap_tokens = _count(ADDED_ROLE, GAP_NOTE, encoding)
    if gap_tokens > room:
        return len(older), 0
    return _kept_from(older, room - gap_tokens), gap_tokens


def _kept_from(older: Sequence[_Unit], room: int) -> int:
    """The start of the newest contiguous run of units that fits in ``room`` tokens (a pinned
    unit is paid for as a fixed part: it takes no room, and the run goes on past it)."""
    start = len(older)
    while start > 0 and (older[start - 1].pinned or older[start - 1].tokens <= room):
        start -= 1
        if not older[start].pinned:
            room -= older[start].tokens
    return start


def _fit_context(
    files: Sequence[ContextFile], room: int, encoding: str
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """The context-file messages that fit, their tokens, and the names of the files left out.

    Files are tried in the given order, each kept or forgotten whole; when any is forgotten, a
    note naming them follows the kept files (if the note itself fits).
    """
    if not files:
        return [], 0, []
    messages = [_context_message(f) for f in files]
    costs = [_count(ADDED_ROLE, m["content"], encoding) for m in messages]
    if sum(costs) <= room:
        return messages, sum(costs), []
    reserve = _count(ADDED_ROLE, _forgotten_note([f.name for f in files]), encoding)
    left = room - reserve
    kept: list[dict[str, Any]] = []
    forgotten: list[str] = []
    for file, message, cost in zip(files, messages, costs, strict=True):
        if cost <= left:
            kept.append(message)
            left -= cost
        else:
            forgotten.append(file.name)
    used = room - reserve - left
    note = _forgotten_note(forgotten)
    note_cost = _count(ADDED_ROLE, note, encoding)
    if used + note_cost <= room:
        kept.append({"role": ADDED_ROLE, "content": note})
        used += note_cost
    return kept, used, forgotten


def _context_message(file: ContextFile) -> dict[str, Any]:
    return {"role": ADDED_ROLE, "content": f"[Context file: {file.name}]\n{file.text}"}


def _forgotten_note(names: Sequence[str]) -> str:
    return (
        "[Context files left out to fit the context window: "
        f"{', '.join(names)}. Read them again if you need them.]"
    )


def render_stored(
    message: Msg,
    clearings: Mapping[int, ClearingRec],
    encoding: str,
    missing_outputs: Collection[str] = frozenset(),
) -> dict[str, Any]:
    """One stored message as a request sends it in the state ``clearings`` records for it
    (full, aged, cleared, shortened, its arguments shortened): what the cache benchmark prices."""
    return _render(message, clearings, missing_outputs, encoding)


def _render(
    item: Msg | dict[str, Any],
    clearings: Mapping[int, ClearingRec],
    missing_outputs: Collection[str],
    encoding: str,
) -> dict[str, Any]:
    """One OpenAI-format message; a cleared tool result says its fixed placeholder instead, a
    shortened or aged one its head and tail at the size its clearing recorded; an assistant
    message whose arguments aged sends its calls shortened."""
    if isinstance(item, dict):
        return item
    out = item.to_openai()
    if item.role == "assistant" and item.tool_calls:
        calling = clearings.get(item.id)
        if calling is not None and calling.arguments_tokens:
            ref = refs.message_ref(item.id)
            out["tool_calls"] = [shortened_call(call, ref) for call in item.tool_calls]
        return out
    clearing = clearings.get(item.id) if item.role == "tool" else None
    if clearing is not None and clearing.aged:
        out["content"] = shorten.aged_text(
            tokens.content_text(out.get("content")),
            keep=item.tokens - clearing.tokens_reclaimed,
            max_chars=clearing.kept_chars or shorten.DEFAULT_AGED_CHARS,
            frame=tokens.count_message({**out, "content": ""}, encoding),
            encoding=encoding,
            ref=refs.message_ref(item.id),
            path=item.output_path,
            file_exists=item.output_path not in missing_outputs,
        )
    elif clearing is not None and clearing.reason == shorten.SHORTENED:
        out["content"] = shorten.head_and_tail(
            tokens.content_text(out.get("content")),
            item.tokens - clearing.tokens_reclaimed,
            encoding,
            path=item.output_path if item.output_path not in missing_outputs else None,
        )
    elif clearing is not None:
        out["content"] = cleared_placeholder(
            tool_name=item.name,
            call_id=item.tool_call_id or "",
            tokens=item.tokens,
            output_path=item.output_path,
            file_exists=item.output_path not in missing_outputs,
            ref=refs.message_ref(item.id),
        )
    return out


def _fit_tail(
    tail: list[_Unit],
    room: int,
    clearings: Mapping[int, ClearingRec],
    encoding: str,
    pins: Collection[int] = frozenset(),
) -> tuple[
    list[_Unit], list[_Unit], Mapping[int, ClearingRec], tuple[tuple[int, int], ...], list[int]
]:
    """The tail within ``room`` tokens when it can be made to fit, cheapest loss first:

    1. a tool result larger than half the room is sent as its head and tail at that size;
    2. the oldest steps after the last user message are left out (reported as dropped, like
       older history, a gap note in their place);
    3. the remaining tool results are cut to one common size, the largest first.

    The last user message and the newest step are always kept, and so are the steps holding a
    pinned message, whose results are never cut either (``pins``). When no user message leads the
    tail (a summary cut inside an agent turn), the steps left out are the oldest of the history
    itself: they are returned to join the older units (which ``_fit_history`` fits and notes),
    so the request is the same whether a caller left such rows unread or not. Returns the tail,
    those steps, the clearings with the shortened results, the shortenings to record, and the
    ids of the steps left out after a user message."""
    if not tail or sum(unit.tokens for unit in tail) <= room:
        return tail, [], clearings, (), []
    half = max(room // 2, shorten.MIN_KEPT_TOKENS)
    head = 1 if tail[0].is_user else 0
    middle, newest = tail[head:-1], tail[-1:] if len(tail) > head else []
    gap = _Unit([{"role": ADDED_ROLE, "content": GAP_NOTE}], [], 0, False)
    gap.tokens = _count(ADDED_ROLE, GAP_NOTE, encoding) if head else 0
    left = room - gap.tokens
    always = (*tail[:head], *newest, *(unit for unit in middle if unit.pinned))
    left -= sum(_capped(unit, clearings, half, pins) for unit in always)
    kept = len(middle)  # the newest steps that fit once results are capped at half the room
    while kept and (
        middle[kept - 1].pinned or _capped(middle[kept - 1], clearings, half, pins) <= left
    ):
        if not middle[kept - 1].pinned:
            left -= _capped(middle[kept - 1], clearings, half, pins)
        kept -= 1
    cut = [unit for unit in middle[:kept] if not unit.pinned]
    middle = [*(unit for unit in middle[:kept] if unit.pinned), *middle[kept:]]
    tail = [*tail[:head], *([gap] if head and cut else []), *middle, *newest]
    clearings, capped = _shorten_tail(tail, clearings, cap=half, pins=pins)
    extra: tuple[tuple[int, int], ...] = ()
    if sum(unit.tokens for unit in tail) > room:
        excess = sum(u.tokens for u in tail) - room
        clearings, extra = _shorten_tail(tail, clearings, excess=excess, pins=pins)
    if head and len(tail) > 1 and sum(unit.tokens for unit in tail) > room:
        # last resort: the user message alone (with the pinned steps), the turn's other steps
        # reported as left out
        cut = [*cut, *(unit for unit in tail[1:] if unit is not gap and not unit.pinned)]
        held = [unit for unit in tail[1:] if unit.pinned]
        tail = [*tail[:1], *([gap] if held else []), *held]
    sent = {mid for unit in tail for mid in unit.ids}
    done = tuple((mid, n) for mid, n in dict((*capped, *extra)).items() if mid in sent)
    if head:
        return tail, [], clearings, done, [mid for unit in cut for mid in unit.ids]
    return tail, list(cut), clearings, done, []


def _shortened_summary(
    message: dict[str, Any], count: int, room: int, tail: Sequence[_Unit], encoding: str
) -> tuple[dict[str, Any], int]:
    """The summary message within what the tail leaves of ``room`` (but at least half of it):
    its head and tail, when the whole would crowd the newest turn out. Its tokens."""
    keep = max(room - sum(unit.tokens for unit in tail), room // 2, shorten.MIN_KEPT_TOKENS)
    if keep >= count:
        return message, count
    return _summary_cut_to(message, keep, encoding)


def _summary_cut_to(
    message: dict[str, Any], keep: int, encoding: str
) -> tuple[dict[str, Any], int]:
    """The summary message as its head and tail within about ``keep`` tokens, and its tokens."""
    text = shorten.head_and_tail(message["content"], keep, encoding, what="summary")
    return {**message, "content": text}, _count(ADDED_ROLE, text, encoding)


def _capped(
    unit: _Unit, clearings: Mapping[int, ClearingRec], cap: int, pins: Collection[int]
) -> int:
    """The unit's tokens once its tool results above ``cap`` (whole or already shortened, not
    pinned) are cut to it."""
    over = 0
    for item in unit.items:
        if not isinstance(item, Msg) or item.role != "tool" or item.id in pins:
            continue
        clearing = clearings.get(item.id)
        if clearing is None or clearing.reason == shorten.SHORTENED or clearing.aged:
            size = item.tokens - (clearing.tokens_reclaimed if clearing is not None else 0)
            over += max(size - cap, 0)
    return unit.tokens - over


def _shorten_tail(
    tail: Sequence[_Unit],
    clearings: Mapping[int, ClearingRec],
    *,
    excess: int = 0,
    cap: int | None = None,
    pins: Collection[int] = frozenset(),
) -> tuple[Mapping[int, ClearingRec], tuple[tuple[int, int], ...]]:
    """Cut the tool results of the tail above ``cap`` to it, or (no cap) the largest to one
    common size so that ``excess`` tokens go (``core.request.shorten``); the clearings with
    them added and the new ones to record. Nothing changes when even the smallest size would
    not save enough: the error then names the part that is too large. Pinned results are
    never cut."""
    found = [
        (unit, item, item.tokens - (c.tokens_reclaimed if c is not None else 0))
        for unit in tail
        for item in unit.items
        if isinstance(item, Msg)
        and item.role == "tool"
        and item.id not in pins
        and ((c := clearings.get(item.id)) is None or c.reason == shorten.SHORTENED or c.aged)
    ]
    if cap is None:
        cap = shorten.kept_tokens_for([size for _, _, size in found], excess)
    if cap is None:
        return clearings, ()
    added: dict[int, ClearingRec] = {}
    for unit, item, size in found:
        if size > cap:
            added[item.id] = ClearingRec(item.id, shorten.SHORTENED, item.tokens - cap)
            unit.tokens -= size - cap
    records = tuple((mid, c.tokens_reclaimed) for mid, c in added.items())
    return {**clearings, **added}, records


def _tail_error(
    tail_tokens: int, fixed: int, budget: int, window: int, safety_margin: float
) -> BudgetError:
    return BudgetError(
        f"the last user message and what follows need {tail_tokens} tokens, but only "
        f"{max(budget - fixed, 0)} of the {budget}-token budget (window {window}, safety "
        f"margin {safety_margin:g}) are left after the system prompt, tools, reminder, "
        f"summary and pinned messages ({fixed} tokens); compress the conversation or allow a "
        "larger window"
    )


@dataclass(frozen=True, slots=True)
class _Parts:
    """What the history around the kept older units is made of."""

    context: list[dict[str, Any]]
    tail: Sequence[_Unit]
    clearings: Mapping[int, ClearingRec]
    missing_outputs: Collection[str]
    encoding: str
    repeated_call_ids: bool  # some call id is used twice among the messages considered
    family: str = (
        reasoning.OPENAI
    )  # what reasoning the provider takes back (core.counting.reasoning)
    text_only: bool = False  # a text-only request sends no reasoning
    pins: frozenset[int] = frozenset()  # pinned ids: their units are sent wherever the run starts


@dataclass(frozen=True, slots=True)
class _Fitted:
    """The history as sent: from which older unit on, and its messages and tokens."""

    kept_from: int
    gap_tokens: int
    kept_tokens: int  # of the kept older units, as stored
    messages: list[dict[str, Any]]  # gap note, kept older units, context files, the tail
    renamed: int  # tokens the fresh ids of repeated call ids add
    pinned_at: tuple[int, ...] = ()  # positions in ``messages`` of the pinned messages


def _fit_history(older: Sequence[_Unit], room: int, parts: _Parts, *, cut: bool) -> _Fitted:
    """The newest run of older units that fits ``room``, with the parts around it; fitted once
    more with less room when fresh call ids (``unique_call_ids``) take it over."""
    fitted = _history_within(older, room, parts, cut=cut)
    if fitted.renamed and fitted.kept_tokens + fitted.gap_tokens + fitted.renamed > room:
        fitted = _history_within(older, room - fitted.renamed, parts, cut=cut)
    return fitted


def _pinned_positions(
    ends: tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None],
    fitted: _Fitted,
    pinned: Sequence[dict[str, Any]],
) -> tuple[int, ...]:
    """Where the pinned messages sit in ``_whole``'s list: the byte guard ages their media last."""
    start = sum(1 for m in ends[:2] if m is not None)
    history = start + len(pinned)
    return (*range(start, history), *(history + i for i in fitted.pinned_at))


def _whole(
    ends: tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None],
    fitted: _Fitted,
    pinned: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The request's messages: the system prompt and summary, the pinned messages the summary
    covers, the history, the reminder."""
    system_message, summary_message, reminder_message = ends
    messages = [m for m in (system_message, summary_message) if m is not None]
    messages.extend(pinned)
    messages.extend(fitted.messages)
    if reminder_message is not None:
        messages.append(reminder_message)
    return messages


JSON_BYTES_PER_CHAR = 6  # the most one character takes in the JSON of a request (an escape)
MESSAGE_FRAME_BYTES = 200  # role, keys and call ids around a message's text, at most


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


def _shed_bytes(older: Sequence[_Unit], fitted: _Fitted, parts: _Parts, excess: int) -> _Fitted:
    """The history with the oldest kept units left out until about ``excess`` bytes are gone
    (the byte guard, once aged media was not enough): reported as dropped like any other."""
    start = fitted.kept_from
    shed = 0
    while start < len(older) and shed < excess:
        if older[start].pinned:  # sent wherever the kept run starts: nothing to shed
            start += 1
            continue
        rendered = [
            _render(item, parts.clearings, parts.missing_outputs, parts.encoding)
            for item in older[start].items
        ]
        shed += len(json.dumps(rendered, ensure_ascii=False).encode("utf-8"))
        start += 1
    return _history_within(older, 0, parts, cut=True, start=start)


def _history_within(
    older: Sequence[_Unit], room: int, parts: _Parts, *, cut: bool, start: int | None = None
) -> _Fitted:
    if start is None:
        start, gap_tokens = _fit_older(older, room, parts.encoding, cut=cut)
    else:  # a start the byte guard chose: the gap note stands for what it left out
        gap_tokens = _count(ADDED_ROLE, GAP_NOTE, parts.encoding)
    messages = [{"role": ADDED_ROLE, "content": GAP_NOTE}] if gap_tokens else []
    marks: list[int] | None = None
    if parts.pins:  # pinned units before the kept run are sent all the same, in order
        marks = []
        held = [unit for unit in older[:start] if unit.pinned]
        _extend(messages, held, parts, in_progress=False, marks=marks)
    _extend(messages, older[start:], parts, in_progress=False, marks=marks)
    messages.extend(parts.context)
    _extend(messages, parts.tail, parts, in_progress=True, marks=marks)
    renamed = unique_call_ids(messages, parts.encoding) if parts.repeated_call_ids else 0
    kept_tokens = sum(unit.tokens for unit in older[start:] if not unit.pinned)
    return _Fitted(start, gap_tokens, kept_tokens, messages, renamed, tuple(marks or ()))


def unique_call_ids(messages: list[dict[str, Any]], encoding: str) -> int:
    """Give each call id already used earlier in ``messages`` a fresh one, with the results that
    answer it (new dicts, in place in the list); the tokens this adds.

    Some servers number calls per turn (``call_0`` on every turn), and a provider that requires
    unique ids (Anthropic) rejects a request that repeats one. The first use keeps its id, a
    later one becomes ``<id>_<n>``: this depends on the request alone, so the same state gives
    the same bytes. Results follow their call (``_units``), so each takes the next id given to
    a call of the same stored id in the assistant message before it.
    """
    seen: set[str] = set()
    given: dict[str, list[str]] = {}
    added = 0
    for position, message in enumerate(messages):
        renamed = None
        if message.get("tool_calls"):
            given = {}
            calls = []
            for call in message["tool_calls"]:
                stored = new = str(call.get("id", ""))
                uses = 1
                while new in seen:
                    uses += 1
                    new = f"{stored}_{uses}"
                seen.add(new)
                given.setdefault(stored, []).append(new)
                calls.append(call if new == stored else {**call, "id": new})
            if any(new is not old for new, old in zip(calls, message["tool_calls"], strict=True)):
                renamed = {**message, "tool_calls": calls}
        elif message.get("role") == "tool" and given.get(str(message.get("tool_call_id"))):
            new = given[str(message["tool_call_id"])].pop(0)
            if new != message["tool_call_id"]:
                renamed = {**message, "tool_call_id": new}
        if renamed is not None:
            added += tokens.count_message(renamed, encoding)
            added -= tokens.count_message(message, encoding)
            messages[position] = renamed
    return added


def _extend(
    messages: list[dict[str, Any]],
    units: Sequence[_Unit],
    parts: _Parts,
    *,
    in_progress: bool,
    marks: list[int] | None = None,
) -> None:
    """The units' messages as sent, with the reasoning the provider takes back and no other;
    the positions of pinned messages go into ``marks`` (when given)."""
    for unit in units:
        for item in unit.items:
            out = _render(item, parts.clearings, parts.missing_outputs, parts.encoding)
            if isinstance(item, Msg) and (item.extra or item.content_parts):
                out = reasoning.as_sent(
                    out, parts.family, in_progress=in_progress, text_only=parts.text_only
                )
            if (
                marks is not None
                and unit.pinned
                and isinstance(item, Msg)
                and item.id in parts.pins
            ):
                marks.append(len(messages))
            messages.append(out)


def _drop_reasoning(
    older: Sequence[_Unit],
    tail: Sequence[_Unit],
    clearings: Mapping[int, ClearingRec],
    family: str,
    *,
    model: str,
    text_only: bool,
) -> tuple[tuple[int, int], ...]:
    """Take out of the units' stored counts the reasoning this request does not send (a stored
    count holds what the message sends while its turn is in progress: ``tokens.count_reasoning``).

    Returns the older messages whose thinking is left out and not yet recorded: (id, tokens).
    """
    records: list[tuple[int, int]] = []
    for in_progress, units in ((False, older), (True, tail)):
        for unit in units:
            item = unit.items[0]
            if not isinstance(item, Msg) or item.role != "assistant":
                continue
            if not (item.extra or item.content_parts):
                continue
            clearing = clearings.get(item.id)
            dropped = _reasoning_dropped(
                item, clearing, family, model=model, in_progress=in_progress, text_only=text_only
            )
            unit.tokens -= dropped
            fresh = clearing is None or clearing.arguments_only  # no reasoning row yet
            if dropped and fresh and not in_progress and not text_only:
                records.append((item.id, dropped))
    return tuple(records)


def _reasoning_dropped(
    message: Msg,
    clearing: ClearingRec | None,
    family: str,
    *,
    model: str,
    in_progress: bool,
    text_only: bool,
) -> int:
    """Tokens of the message's stored count that hold reasoning this request does not send."""
    if clearing is not None and clearing.reason == REASONING_CLEARING and not text_only:
        return 0 if in_progress else clearing.tokens_reclaimed - clearing.arguments_tokens
    raw = message.to_openai()
    if not reasoning.carries(raw):
        return 0
    encoding = tokens.encoding_name_for(model)
    sent = reasoning.as_sent(raw, family, in_progress=in_progress, text_only=text_only)
    stored = tokens.count_reasoning(raw, encoding, model=model)
    return max(stored - tokens.count_reasoning(sent, encoding), 0)


def _alternate(messages: list[dict[str, Any]], encoding: str) -> int:
    """Merge neighbouring turns of one role in place (``render.alternated``); the tokens that
    changes (a merged turn pays its overhead once)."""
    merged = render.alternated(messages)
    if len(merged) == len(messages):
        return 0
    delta = tokens.count_messages(merged, encoding) - tokens.count_messages(messages, encoding)
    messages[:] = merged
    return delta


MAX_CACHE_MARKS = 4  # Anthropic takes at most four cache breakpoints per request
ROLLING_MARKS = 2  # the newest messages marked: this request writes what the next one reads


def _mark_cache(
    messages: list[dict[str, Any]],
    has_system: bool,
    has_summary: bool,
    has_reminder: bool,
    encoding: str,
    pinned: int = 0,
) -> int:
    """Cache breakpoints after the stable prefix (the system prompt, which tools come before,
    the summary and the ``pinned`` messages after it) and on the newest two messages before the
    reminder that carry text: the
    provider caches the prefix up to a mark, so the next request, which only adds messages,
    reads everything this one wrote and pays in full only for what is new. At most four marks;
    returns the tokens the marks add (counted in the request)."""
    prefix = [0] if has_system else []
    after_system = 1 if has_system else 0
    stable = (1 if has_summary else 0) + pinned  # the summary and the pinned messages after it
    if stable:
        prefix.append(after_system + stable - 1)
    end = len(messages) - (1 if has_reminder else 0)
    rolling: list[int] = []
    for position in range(end - 1, after_system + stable - 1, -1):
        if len(rolling) == min(ROLLING_MARKS, MAX_CACHE_MARKS - len(prefix)):
            break
        if tokens.content_text(messages[position].get("content")).strip():
            rolling.append(position)
    added = 0
    for position in (*prefix, *rolling):
        before = messages[position]
        messages[position] = render.with_cache_mark(before)
        added += tokens.count_message(messages[position], encoding)
        added -= tokens.count_message(before, encoding)
    return added
