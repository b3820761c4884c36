"""``compress_session`` as core code: claim, read, decide, call the summarizer with no session,
write; the summarizer (``Parts.summarizers``), the reporter of its events and the clock injected.

The claim takes the conversation's lease in one short transaction (``core.storage.lease``),
committed before anything is read. Phase 1 is a short read session of the content-free snapshot
(``core.storage.snapshot``), decided by ``core.decision.policy``; the text of the messages to
summarize is read only then. Phase 2 calls the summarizer (``core.compression.summarizer``: the
offline extractive one, a litellm model through ``workers.summarizers``, or a host's own) with no
session or connection held. Phase 3 is one short
write transaction (``core.storage.summaries.write_run``): the summary (a conflict on
(conversation, cutoff) means another run already did it), the log row, the lease let go.

Escalation, cheapest first, stopping once under the trigger: clear eligible old tool results, then
summarize, in chunks when the summarizer's input does not fit its window; otherwise fail clearly.
A run never loops: a bounded number of passes (a re-check when the conversation turned dirty
meanwhile), of chunk shrinks and of retention re-asks; model errors worth retrying surface as
``RetryLater`` for Celery to retry with backoff, a bounded number of times. A write that finds the
database away is retried in place (``core.compression.dbretry``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache, partial
from importlib.metadata import entry_points
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from recap.core import tracing
from recap.core.compression import prefix, provider, report
from recap.core.compression.dbretry import database_unavailable
from recap.core.compression.report import DELETED_REASON, RECREATED_REASON, LogReporter, Reporter
from recap.core.compression.summarizer import (
    RetryLater,
    Summarizers,
    SummaryFailed,
    SummaryText,
    offline,
)
from recap.core.compression.write import (
    Outcome,
    durably_within_lease,
    release_after_failure,
    retry_for_database,
    write_run,
)
from recap.core.counting import tokens
from recap.core.decision import policy
from recap.core.errors import ConversationGone, NotFoundError
from recap.core.redact import known_secrets, redact
from recap.core.request.refs import summary_note
from recap.core.results import CompressResult
from recap.core.settings import Settings
from recap.core.storage import lease, store, sweep
from recap.core.storage import snapshot as snapshots
from recap.core.storage.db import session_scope
from recap.core.storage.models import CompactionLog, table_of, utcnow
from recap.core.summaries import planning, sizing
from recap.core.summaries.planning import Split
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.core.values.actions import Action
from recap.core.values.clearing import ClearingPlan
from recap.core.values.records import ClearingRec, Msg

__all__ = [  # what the workers' wiring (workers.compress) and the host API import from here
    "COMPACTION_LOG",
    "DELETED_REASON",
    "Outcome",
    "Parts",
    "RetryLater",
    "compress_session",
]

COMPACTION_LOG = table_of(CompactionLog)
MAX_PASSES = 3  # the first pass plus up to two re-checks when new turns arrived meanwhile

Clock = Callable[[], datetime]
Snapshot = policy.Snapshot  # what a run decides from (no message text) and summarizes with
T = TypeVar("T")


@dataclass(frozen=True)
class Parts:
    """What a run is given rather than builds: the summarizer for an attempt and where its events
    go (the workers pass litellm's summarizer and a reporter that also publishes on Redis)."""

    summarizers: Summarizers = offline
    reporter: Reporter = field(default_factory=LogReporter)


@dataclass(frozen=True, kw_only=True)
class Run:
    """The fixed inputs of one ``compress_session`` call."""

    engine: Engine
    settings: Settings
    conversation_id: str
    leaf: int | None
    force: bool
    attempt: int
    trigger: str
    task_id: str | None
    clock: Clock
    deadline: float  # time.monotonic() by which the run ends: Settings.run_seconds from its start
    parts: Parts = field(default_factory=Parts)
    # The conversation's incarnation, read as the lease is taken (None before): every read and
    # write of the run checks it, so a conversation deleted and created again under the same
    # id meanwhile is neither read nor written for this run.
    incarnation: str | None = None
    knobs: policy.Knobs = field(init=False)  # the decision's knobs, read from the settings once

    def __post_init__(self) -> None:
        object.__setattr__(self, "knobs", policy.Knobs.from_settings(self.settings))

    def emit(self, event: str, **fields: Any) -> None:
        self.parts.reporter.emit(self.settings, event, **fields)


@dataclass(frozen=True, kw_only=True)
class PassResult:
    """One pass: its outcome, the summary row to insert, and (after a summary) the messages the
    request now carries after the new cutoff, with their clearings."""

    outcome: Outcome
    row: dict[str, Any] | None = None
    recent: tuple[Msg, ...] = ()
    clearings: Mapping[int, ClearingRec] = field(default_factory=dict)
    pinned: frozenset[int] = frozenset()  # never cleared after the summary either
    sources: Mapping[str, str | None] = field(default_factory=dict)  # Snapshot.sources


ENTRY_POINT_GROUP = "recap.engine"  # the distribution names its parts here (pyproject.toml)


@lru_cache(maxsize=1)
def installed_parts() -> Parts:
    """The parts this installation provides (the ``recap.engine`` entry point ``parts``: in the
    recap distribution, litellm's summarizer and the Redis publisher), else core's own (the
    extractive summary, events as log lines)."""
    for entry in entry_points(group=ENTRY_POINT_GROUP, name="parts"):
        made = entry.load()()
        if isinstance(made, Parts):
            return made
    return Parts()


# --- claim, then read --------------------------------------------------------------------------


def claim(engine: Engine, settings: Settings, run: Run) -> lease.Lease | None:
    """Take the conversation's lease in one short transaction, committed before anything is
    read; None, with the conversation marked dirty for its holder, when another run holds it.
    Raises ``NotFoundError`` for an unknown conversation or leaf (no lease taken for either)."""
    if run.leaf is not None:
        with session_scope(engine) as session:
            snapshots.check_leaf(session, run.conversation_id, run.leaf)
    return lease.acquire(
        engine,
        run.conversation_id,
        owner=lease.new_owner(),
        now=run.clock(),
        seconds=settings.lease_seconds,
    )


@tracing.traced("recap.compress.read")
def snapshot_for(run: Run) -> Snapshot:
    """One short read session of the content-free snapshot, with the failed runs the cooldown
    needs."""
    with session_scope(run.engine) as session:
        _check_incarnation(session, run.conversation_id, run.incarnation)
        return snapshots.read_snapshot(
            session,
            run.conversation_id,
            run.leaf,
            now=run.clock(),
            failures=run.settings.failure_streak,
        )


def _check_incarnation(session: Any, conversation_id: str, incarnation: str | None) -> None:
    """A ``ConversationGone`` unless the conversation is still the one the run's lease was
    taken on (when it was taken: ``incarnation`` is not None)."""
    if incarnation is None:
        return
    if store.incarnation_of(session.connection(), conversation_id) != incarnation:
        raise ConversationGone(f"conversation {conversation_id!r} was deleted")


@tracing.traced("recap.compress.read_head")
def early_skip(run: Run) -> tuple[policy.Decision, int | None, int] | None:
    """The decision's skip when an upper bound on the latest branch's history is under the
    trigger (two aggregate reads, no message row), with the latest message id and the history
    in provider tokens as ``stats`` shows it (what the run reports); else None."""
    with session_scope(run.engine) as session:
        _check_incarnation(session, run.conversation_id, run.incarnation)
        bound = snapshots.history_bound(session, run.conversation_id)
        if bound is None:
            return None
        head = snapshots.head_snapshot(session, run.conversation_id, now=run.clock())
    decision = policy.early_skip(head, run.knobs, bound.tokens)
    if decision is None:
        return None
    return decision, bound.leaf, decision.pressure.budget.history(bound.history)


@tracing.traced("recap.compress.read_text")
def with_text(
    engine: Engine, conversation_id: str, split: Split, incarnation: str | None = None
) -> Split:
    """The split with its messages' text: the only content a run reads."""
    ids = [m.id for m in (*split.older, *split.recent)]
    with session_scope(engine) as session:
        _check_incarnation(session, conversation_id, incarnation)
        rows = snapshots.load_contents(session, conversation_id, ids)
    if len(rows) < len(set(ids)):  # deleted since the snapshot was read
        raise ConversationGone(f"conversation {conversation_id!r} was deleted")
    return replace(  # the decision's summary room travels with it
        split,
        older=tuple(rows[m.id] for m in split.older),
        recent=tuple(rows[m.id] for m in split.recent),
    )


@tracing.traced("recap.compress.clear")
def clearing_step(
    engine: Engine,
    conversation_id: str,
    plan: ClearingPlan,
    now: datetime,
    incarnation: str | None = None,
) -> sweep.Applied:
    """Record a decision's clearings (every stage: aged, cleared, shortened arguments), in the
    conversation the run read (``incarnation``)."""
    if not plan:
        return sweep.Applied(0, 0)
    with session_scope(engine) as session:
        if not store.lock_conversation(session, conversation_id, incarnation=incarnation):
            raise ConversationGone(f"conversation {conversation_id!r} was deleted")
        return sweep.apply_clearings(session, conversation_id, plan, now=now)


# --- one pass ----------------------------------------------------------------------------------


def one_pass(run: Run) -> PassResult:
    """Read, decide (``core.decision.policy``), clear and maybe summarize; the outcome and what
    to write. Without a leaf or force, a conversation far under its trigger is skipped from two
    aggregates before its branch is read."""
    if run.leaf is None and not run.force:
        early = early_skip(run)
        if early is not None:
            decision, leaf, size = early
            return PassResult(outcome=_unchanged(Action.SKIPPED, decision.reason, size, leaf))
    snapshot = snapshot_for(run)
    decision = policy.decide(snapshot, run.knobs, force=run.force)
    before = decision.pressure.history
    base = _unchanged(Action.SKIPPED, "", before, snapshot.leaf_id)
    if decision.action == policy.SKIP:  # nothing to do: no started event, nothing written
        return PassResult(outcome=replace(base, reason=decision.reason))
    started = {k: v for k, v in _event_fields(run, base).items() if k != "action"}
    run.emit(report.STARTED, **started, forced=run.force, urgent=decision.urgent)
    # the chat's last request as sent (for a summary): built before this run's clearings
    chat = prefix.for_summary(run.engine, run.settings, snapshot, decision, run.incarnation)
    if decision.clear:
        applied = clearing_step(
            run.engine, run.conversation_id, decision.clear, run.clock(), run.incarnation
        )
        after = before - decision.pressure.budget.history(applied.tokens_reclaimed)
        if decision.action == policy.CLEAR and applied.steps:
            reason = applied.describe()
            return PassResult(
                outcome=replace(base, action=Action.CLEARED, reason=reason, tokens_after=after)
            )
        base = replace(base, tokens_after=after)
    if decision.action != policy.SUMMARIZE or decision.split is None:
        return PassResult(outcome=replace(base, reason=decision.reason))
    return summarize(run, replace(snapshot, clearings=decision.clearings), decision, base, chat)


def summarize(
    run: Run, snapshot: Snapshot, decision: policy.Decision, base: Outcome, chat: Any = None
) -> PassResult:
    """Read the split's text, call the summarizer (no session held) with the chat's last request
    (``chat``: its request on that prefix where it can be), validate; the row to insert."""
    assert decision.split is not None
    split = with_text(run.engine, run.conversation_id, decision.split, run.incarnation)
    split = replace(split, prefix=chat)
    try:
        summarizer = run.parts.summarizers(run.settings, run.attempt, run.deadline)
        result = summarizer.summarize(snapshot, split)
    except SummaryFailed as exc:  # a provider's error can quote the key: masked here
        reason = redact(str(exc), known_secrets(run.settings))
        return PassResult(outcome=replace(base, action=Action.FAILED, reason=reason, error=reason))
    return _validated(run, snapshot, split, result, base)


def _validated(
    run: Run, snapshot: Snapshot, split: Split, result: SummaryText, base: Outcome
) -> PassResult:
    clearings = snapshot.clearings
    encoding = tokens.encoding_name_for(snapshot.model)
    note = summary_note(split.cutoff_message_id)

    def sent_tokens(text: str) -> int:
        sent = SUMMARY_MESSAGE_PREFIX + text + note
        return tokens.count_message({"role": "user", "content": sent}, encoding)

    limit = sizing.summary_limit(split.summary_room, run.settings.summary_max_output_tokens)
    result.text = sizing.cut_summary(result.text, limit, sent_tokens)  # within its room and cap
    summary_tokens = sent_tokens(result.text)
    replaced = (snapshot.summary.tokens if snapshot.summary else 0) + planning.replaced_tokens(
        split.older, clearings, snapshot.pinned_ids
    )
    base = replace(
        base,
        model=result.model,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        cost=result.cost,
        cached_input_tokens=result.cached_input_tokens,
    )
    problem = planning.rejection_reason(
        result.text, summary_tokens=summary_tokens, replaced_tokens=replaced
    )
    if problem is not None:
        reason = f"summary rejected: {problem}"
        return PassResult(outcome=replace(base, action=Action.FAILED, reason=reason, error=reason))
    factor = policy.budget_of(snapshot, run.knobs).calibration
    after = base.tokens_after - math.ceil(replaced * factor) + math.ceil(summary_tokens * factor)
    outcome = replace(
        base,
        calibration=factor,
        action=Action.SUMMARIZED,
        reason=f"summarized {len(split.older)} messages in {max(result.calls, 1)} call(s)",
        cutoff_message_id=split.cutoff_message_id,
        tokens_after=after,
    )
    row = {
        "conversation_id": snapshot.conversation_id,
        "cutoff_message_id": split.cutoff_message_id,
        "previous_summary_id": snapshot.summary.id if snapshot.summary else None,
        "text": result.text,
        "tokens": summary_tokens,
        "encoding": encoding,
        "model": result.model,
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "identifier_retention": result.retention,
        "created_at": run.clock(),
        "pending": True,  # used from the first request where that pays (core.decision.activation)
    }
    outcome = replace(outcome, reason=outcome.reason + provider.attach(run, snapshot, split, row))
    return PassResult(
        outcome=outcome,
        row=row,
        recent=split.recent,
        clearings=snapshot.clearings,
        pinned=snapshot.pinned_ids,
        sources=snapshot.sources,
    )


# --- the whole run -----------------------------------------------------------------------------


def _event_fields(run: Run, outcome: Outcome) -> dict[str, Any]:
    return {
        "conversation_id": run.conversation_id,
        "task_id": run.task_id,
        "action": outcome.action,
        "tokens_before": outcome.tokens_before,
        "tokens_after": outcome.tokens_after,
    }


def compress_session(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf_message_id: int | None = None,
    force: bool = False,
    *,
    attempt: int = 0,
    trigger: str = "enqueue",
    task_id: str | None = None,
    clock: Clock = utcnow,
    parts: Parts | None = None,
) -> CompressResult:
    """One ``compress_session`` run under the conversation's lease; what it did.

    Raises ``NotFoundError`` for an unknown conversation or leaf, and ``RetryLater`` when the
    model failed in a way worth retrying and attempts are left (the lease is released first).
    """
    started = time.monotonic()
    deadline = started + settings.run_seconds
    run = Run(
        engine=engine,
        settings=settings,
        conversation_id=conversation_id,
        leaf=leaf_message_id,
        force=force,
        attempt=attempt,
        trigger=trigger,
        task_id=task_id,
        clock=clock,
        deadline=deadline,
        parts=parts or Parts(),
    )
    try:
        held = claim(engine, settings, run)
    except DBAPIError as exc:  # the read failed: Celery tries again later
        retry = retry_for_database(run, exc)
        if retry is None:
            raise
        _log_retry_if_possible(run, retry, started)
        raise retry from exc
    if held is None:
        return _busy(run, started)
    run = replace(run, incarnation=held.incarnation)
    try:
        outcome = _passes_unless_deleted(run, held, started)
    except BaseException as exc:
        release_after_failure(run, held, exc)
        later = retry_for_database(run, exc) if isinstance(exc, DBAPIError) else exc
        if not isinstance(later, RetryLater):
            raise
        _log_retry_if_possible(run, later, started)
        if later is exc:
            raise
        raise later from exc
    fields = {**_event_fields(run, outcome), "reason": outcome.reason}
    fields["duration_ms"] = _ms(started)
    run.emit(report.FAILED if outcome.action == Action.FAILED else report.COMPLETED, **fields)
    return outcome


def _passes(run: Run, held: lease.Lease, started: float) -> Outcome:
    """The first pass, then a re-check for each time the conversation turned dirty meanwhile."""
    first: Outcome | None = None
    current: Run = run
    for number in range(MAX_PASSES):
        result = one_pass(current)
        outcome = result.outcome
        out_of_time = time.monotonic() >= run.deadline  # a dirty flag is left for reconcile
        last = number == MAX_PASSES - 1 or outcome.action == Action.FAILED or out_of_time
        if number == 0 or outcome.action != Action.SKIPPED or result.row is not None:
            write = partial(write_run, current, result, held=held, force_release=last)
            outcome, state = durably_within_lease(
                run, held, partial(write, duration_ms=_ms(started)), "write"
            )
        else:
            release = partial(lease.release, run.engine, held, force=last)
            state = durably_within_lease(run, held, release, "release")
        first = _merge(first, outcome)
        if state != "dirty":
            break
        current = replace(run, leaf=None, force=False, trigger="recheck")
    assert first is not None
    return first


def _passes_unless_deleted(run: Run, held: lease.Lease, started: float) -> Outcome:
    """``_passes``, ending as skipped with nothing written when the conversation is deleted
    while the run works on it (``recap delete``, the retention policy), whether or not its id
    is created again meanwhile: its lease went with its row, and its reads and write
    transactions find another incarnation or none (``ConversationGone``)."""
    try:
        return _passes(run, held, started)
    except NotFoundError:
        now = _current_incarnation(run)
        if now is not None and now == run.incarnation:
            raise
    reason = DELETED_REASON if now is None else RECREATED_REASON
    report.log.info(
        "compression_conversation_deleted",
        conversation_id=run.conversation_id,
        task_id=run.task_id,
        recreated=now is not None,
        duration_ms=_ms(started),
    )
    return _unchanged(Action.SKIPPED, reason)


def _current_incarnation(run: Run) -> str | None:
    """The incarnation stored under the run's conversation id now (None: no such row)."""
    with session_scope(run.engine) as session:
        return store.incarnation_of(session.connection(), run.conversation_id)


def _merge(first: Outcome | None, later: Outcome) -> Outcome:
    """The run's result: the first pass that acted, with the latest token count."""
    if first is None:
        return later
    if first.action == Action.SKIPPED and later.action != Action.SKIPPED:
        return later
    return replace(first, tokens_after=later.tokens_after)


def _unchanged(action: Action, reason: str, tokens: int = 0, leaf: int | None = None) -> Outcome:
    """An outcome that changed nothing: ``tokens`` before and after, at ``leaf``."""
    return Outcome(
        action=action,
        reason=reason,
        tokens_before=tokens,
        tokens_after=tokens,
        leaf_message_id=leaf,
    )


def _busy(run: Run, started: float) -> Outcome:
    outcome = _unchanged(Action.BUSY, "another run holds this conversation; it will re-check")
    run.emit(report.COMPLETED, **_event_fields(run, outcome), duration_ms=_ms(started))
    return outcome


def _log_retry(run: Run, exc: RetryLater, started: float) -> None:
    reason = redact(exc.reason, known_secrets(run.settings))
    report.log.warning(
        "compression_retry",
        conversation_id=run.conversation_id,
        task_id=run.task_id,
        attempt=run.attempt + 1,
        delay_s=round(exc.delay, 2),
        error=reason,
        duration_ms=_ms(started),
    )
    outcome = replace(_unchanged(Action.RETRY, f"retrying in {exc.delay:.1f} s"), error=reason)
    write_run(run, PassResult(outcome=outcome), held=None, duration_ms=_ms(started))


def _log_retry_if_possible(run: Run, exc: RetryLater, started: float) -> None:
    """``_log_retry``, whose row cannot be written while the database is away (the log line
    still is)."""
    try:
        _log_retry(run, exc, started)
    except NotFoundError:  # deleted meanwhile: no row to write, the retry will skip
        return
    except DBAPIError as error:
        if not database_unavailable(error):
            raise


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
