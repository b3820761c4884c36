"""``compress_session`` as a service: read, decide, call the model with no session, write.

Phase 1 is a short read session that copies plain values out. Phase 2 calls the summarizer (a
litellm model, or the offline extractive one) with no session or connection held. Phase 3 is a
fresh short write session that inserts the summary (a conflict on (conversation, cutoff) means
another run already did it) and the compaction-log row.

Escalation, cheapest first, stopping once under the trigger: clear eligible old tool results, then
summarize, in chunks when the summarizer's input does not fit its window; otherwise fail clearly.
A run never loops: a bounded number of passes (a re-check when the conversation turned dirty
meanwhile), of chunk shrinks and of retention re-asks; model errors worth retrying surface as
``RetryLater`` for Celery to retry with backoff, a bounded number of times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from core import compression, store, sweep, tokens, toolresults
from core.branch import applicable_summary
from core.compression import CompressionParams, Rendered, Split
from core.db import session_scope
from core.errors import NotFoundError
from core.extractive import extractive_summary
from core.identifiers import identifiers_of_span, retention
from core.models import CONVERSATIONS, SUMMARIES, CompactionLog, table_of, utcnow
from core.prompts import SUMMARY_MESSAGE_PREFIX
from core.records import ClearingRec, Msg, SummaryRec
from core.settings import Settings
from workers import events, lease

COMPACTION_LOG = table_of(CompactionLog)
EXTRACTIVE_MODEL = "extractive"
MAX_PASSES = 3  # the first pass plus up to two re-checks when new turns arrived meanwhile
MAX_SHRINKS = 2  # a context-window error halves the summarizer's assumed window, at most twice
RECONCILE_BATCH = 500  # conversations examined per reconcile pass
ERROR_CHARS = 500  # an error stored in the log is cut here
REASON_QUOTE_CHARS = 200  # a cooldown's reason quotes the last failure up to this length
COOLDOWN_DOUBLINGS = compression.COOLDOWN_MAX_FACTOR.bit_length()  # failures read past the streak
# An unknown summary model (a local model, a proxy alias) is assumed to take 8k tokens, which any
# current chat model does; a context-window error from it halves the assumption.
FALLBACK_SUMMARIZER_WINDOW = 8_192
COUNT_CACHE_SIZE = 4_096  # rendered messages whose token counts are kept
# A model call is started only with this much of the run's time left (less when RECAP_LLM_TIMEOUT
# or half the run is less): a summary cut off by the deadline is paid for and thrown away.
CALL_FLOOR_SECONDS = 10
DEADLINE_SLACK_SECONDS = 0.5  # a timeout this close to the deadline is the deadline's doing

Clock = Callable[[], datetime]


class RetryLater(Exception):
    """A retryable model error: the task should run again after ``delay`` seconds."""

    def __init__(self, reason: str, delay: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class SummaryFailed(Exception):
    """The summarizer gave up or its summary was rejected; nothing is stored."""


class OutOfTime(SummaryFailed):
    """The run's own deadline (``Settings.run_seconds``) left no time for the next model call.

    Celery enforces no time limit on the threads pool the compress queue runs on, so a run keeps
    its own: each call's timeout is cut to what is left, and no call starts that could not end
    in time. The lease outlives the deadline, so no second run starts while this one works.
    """


@dataclass
class Outcome:
    """What one run did: the contract's JSON, plus what the log row records."""

    action: str
    reason: str
    tokens_before: int
    tokens_after: int
    summary_id: int | None = None
    cutoff_message_id: int | None = None
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    error: str | None = None
    leaf_message_id: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The object ``recap compress --json`` prints and the task returns."""
        return {
            "action": self.action,
            "reason": self.reason,
            "summary_id": self.summary_id,
            "cutoff_message_id": self.cutoff_message_id,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }


@dataclass(frozen=True)
class Snapshot:
    """Plain values copied out of the phase-1 read."""

    conversation_id: str
    model: str
    encoding: str
    leaf_id: int | None
    branch: list[Msg]
    summary: SummaryRec | None
    clearings: dict[int, ClearingRec]
    params: CompressionParams
    failures: tuple[Failure, ...] = ()  # failed runs since the last summary, newest first


@dataclass(frozen=True)
class Failure:
    """A failed run, as the cooldown sees it."""

    at: datetime
    reason: str


@dataclass
class SummaryText:
    """A summarizer's result, before it is stored."""

    text: str
    model: str
    retention: float
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    calls: int = 0
    requests: list[list[Rendered]] = field(default_factory=list)


# --- phase 1 -----------------------------------------------------------------------------------


def load_state(session: Session, conversation_id: str, leaf: int | None) -> store.BranchState:
    """The branch, its summary and clearings as plain values (Core reads, no ORM objects)."""
    c = CONVERSATIONS.c
    head = (
        session.connection()
        .execute(select(c.model, c.max_input_tokens).where(c.id == conversation_id))
        .first()
    )
    if head is None:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    branch = store.load_branch(session, conversation_id, leaf)
    summaries = store.load_summaries(session, conversation_id)
    return store.BranchState(
        conversation_id=conversation_id,
        model=str(head[0]),
        max_input_tokens=head[1],
        branch=branch,
        summary=applicable_summary(summaries, {m.id for m in branch}),
        clearings=store.load_clearings(session, conversation_id),
    )


def recent_failures(session: Session, conversation_id: str, settings: Settings) -> list[Failure]:
    """The conversation's failed runs since its last summary, newest first (as many as the
    cooldown can use)."""
    c = COMPACTION_LOG.c
    statement = (
        select(c.action, c.created_at, c.reason)
        .where(c.conversation_id == conversation_id, c.action.in_(("failed", "summarized")))
        .order_by(c.id.desc())
        .limit(settings.failure_streak + COOLDOWN_DOUBLINGS)
    )
    failures: list[Failure] = []
    for action, at, reason in session.connection().execute(statement):
        if action != "failed":
            break
        failures.append(Failure(store.as_utc(at) or utcnow(), str(reason)))
    return failures


def read_snapshot(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf: int | None,
    *,
    with_failures: bool = True,
) -> Snapshot:
    """One short read session; everything after it works on plain values. ``with_failures``
    reads the failed runs the cooldown needs (a check of the trigger alone does not)."""
    with session_scope(engine) as session:
        return snapshot_in(session, settings, conversation_id, leaf, with_failures=with_failures)


def snapshot_in(
    session: Session,
    settings: Settings,
    conversation_id: str,
    leaf: int | None,
    *,
    with_failures: bool = True,
) -> Snapshot:
    """The snapshot read in an open session (the caller's transaction, as when claiming)."""
    state = load_state(session, conversation_id, leaf)
    failures = recent_failures(session, conversation_id, settings) if with_failures else []
    return snapshot_of(state, settings, failures)


def snapshot_of(
    state: store.BranchState, settings: Settings, failures: Sequence[Failure] = ()
) -> Snapshot:
    """The decision's numbers for a loaded branch."""
    window = tokens.context_window(state.model, state.max_input_tokens)
    history = compression.request_history_tokens(state.branch, state.summary, state.clearings)
    params = compression.get_compression_params(
        window=window,
        history_tokens=history,
        reserve_tokens=tokens.TOKENS_REPLY_PRIMING,
        safety_margin=settings.safety_margin,
        trigger_ratio=settings.trigger_ratio,
        recent_ratio=settings.recent_ratio,
        recent_min_tokens=settings.recent_min_tokens,
        recent_max_tokens=settings.recent_max_tokens,
        keep_turns=settings.keep_turns,
    )
    return Snapshot(
        conversation_id=state.conversation_id,
        model=state.model,
        encoding=tokens.encoding_name_for(state.model),
        leaf_id=state.leaf_id,
        branch=state.branch,
        summary=state.summary,
        clearings=state.clearings,
        params=params,
        failures=tuple(failures),
    )


def claim(engine: Engine, settings: Settings, run: Run) -> tuple[lease.Lease, Snapshot] | None:
    """Take the conversation's lease and read it in one short transaction; None (and the
    conversation marked dirty for its holder) when another run holds it."""
    owner = lease.new_owner()
    now = run.clock()
    cid = run.conversation_id
    for _ in range(lease.ACQUIRE_TRIES):
        with session_scope(engine) as session:
            connection = session.connection()
            held = lease.take(connection, cid, owner=owner, now=now, seconds=settings.lease_seconds)
            if held is not None:
                return held, snapshot_in(session, settings, cid, run.leaf)
            exists = select(CONVERSATIONS.c.id).where(CONVERSATIONS.c.id == cid)
            if connection.execute(exists).first() is None:
                raise NotFoundError(f"unknown conversation {cid!r}")
            if lease.mark_dirty(connection, cid, now):
                return None
    return None


# --- the clearing step -------------------------------------------------------------------------


def clearing_step(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    sent: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    now: datetime,
    *,
    reason: str = toolresults.PRESSURE,
) -> tuple[int, int]:
    """Clear eligible old tool results of ``sent`` (the messages a request carries after any
    summary), by ``core.toolresults``'s policy; returns (results cleared, tokens reclaimed). Under
    pressure only a saving of ``clear_at_least_tokens`` is worth a cold cache; right after a
    summary any saving is."""
    plan = toolresults.plan_clearings(
        sent,
        clearings,
        keep_last=settings.keep_tool_results,
        protected=settings.protected_tools,
        min_tokens=toolresults.min_tokens_for(reason, settings.clear_at_least_tokens),
        reason=reason,
    )
    if not plan:
        return 0, 0
    with session_scope(engine) as session:
        applied = sweep.apply_clearings(session, conversation_id, plan, now=now)
    return applied.cleared, applied.tokens_reclaimed


# --- phase 2: the summarizer -------------------------------------------------------------------


def summarizer_window(settings: Settings) -> int:
    """The summary model's input window from litellm's map, else a conservative guess."""
    entry = tokens.model_info(settings.summary_model or "")
    return int(entry["max_input_tokens"]) if entry else FALLBACK_SUMMARIZER_WINDOW


@lru_cache(maxsize=COUNT_CACHE_SIZE)
def _count_cached(role: str, content: str, encoding: str) -> int:
    return tokens.count_message({"role": role, "content": content}, encoding)


def _counter(encoding: str) -> compression.Counter:
    """Tokens of a rendered message; the prompt, marker, reminder and recent context repeat
    from run to run, so counts are cached by text."""
    return lambda message: _count_cached(
        str(message.get("role", "")), str(message.get("content") or ""), encoding
    )


def summarize_extractive(snapshot: Snapshot, split: Split) -> SummaryText:
    """The offline summary of the older part, merged into the previous summary."""
    previous = snapshot.summary.text if snapshot.summary else None
    text = extractive_summary(split.older, previous_summary=previous, clearings=snapshot.clearings)
    score = retention(identifiers_of_span(split.older), text).score
    return SummaryText(text=text, model=EXTRACTIVE_MODEL, retention=score)


def summarize_with_model(
    settings: Settings, snapshot: Snapshot, split: Split, *, attempt: int, deadline: float
) -> SummaryText:
    """Chunked progressive summary by the configured model; one re-ask when identifiers are lost.

    Raises ``RetryLater`` for a retryable error with attempts left, ``SummaryFailed`` otherwise.
    """
    from workers import llm

    window = summarizer_window(settings)
    for _shrink in range(MAX_SHRINKS + 1):
        try:
            return _summarize_chunks(settings, snapshot, split, window, deadline)
        except llm.ContextTooLongError:
            window //= 2
        except llm.RetryableLLMError as exc:
            if attempt + 1 >= settings.max_attempts:
                raise SummaryFailed(f"gave up after {attempt + 1} attempts: {exc}") from exc
            delay = llm.backoff_seconds(attempt, settings.retry_backoff_max)
            raise RetryLater(str(exc), delay) from exc
        except llm.LLMError as exc:
            raise SummaryFailed(f"the summarizer failed: {exc}") from exc
        except compression.SummarizerWindowError as exc:
            raise SummaryFailed(str(exc)) from exc
    raise SummaryFailed("the summarizer's input did not fit its window even in small chunks")


def _summarize_chunks(
    settings: Settings, snapshot: Snapshot, split: Split, window: int, deadline: float
) -> SummaryText:
    from workers import llm

    encoding = tokens.encoding_name_for(settings.summary_model or snapshot.model)
    count = _counter(encoding)
    names = compression.tool_names(snapshot.branch)
    older = compression.render_messages(
        split.older,
        names=names,
        result_chars=compression.OLDER_RESULT_CHARS,
        clearings=snapshot.clearings,
    )
    recent = compression.render_messages(
        split.recent,
        names=names,
        result_chars=compression.RECENT_RESULT_CHARS,
        clearings=snapshot.clearings,
    )
    previous = snapshot.summary.text if snapshot.summary else None
    plan = compression.plan_summary(
        older=older,
        recent=recent,
        prompt=settings.summary_prompt,
        previous_summary_tokens=snapshot.summary.tokens if snapshot.summary else 0,
        window=window,
        max_output_tokens=settings.summary_max_output_tokens,
        count=count,
    )
    result = SummaryText(text=previous or "", model=settings.summary_model or "", retention=0.0)
    for index, chunk in enumerate(plan.chunks):
        last = index == len(plan.chunks) - 1
        messages = compression.build_summary_messages(
            prompt=settings.summary_prompt,
            previous_summary=result.text or None,
            older=chunk,
            recent=plan.recent if last else (),
        )
        seed = result.text or None
        _call(llm, settings, messages, result, deadline)
        if not last and compression.rejection_reason(
            result.text, summary_tokens=0, replaced_tokens=1
        ):
            raise SummaryFailed(f"chunk {index + 1} of {len(plan.chunks)} gave no usable summary")
    wanted = identifiers_of_span(split.older)
    score = retention(wanted, result.text)
    result.retention = score.score
    usable = compression.rejection_reason(result.text, summary_tokens=0, replaced_tokens=1) is None
    if usable and score.score < settings.identifier_retention_floor and score.missing:
        try:
            _reask(llm, settings, result, plan, seed, score.missing, wanted, count, deadline)
        except OutOfTime:  # the first summary stands; the re-ask only ever improves on it
            events.log.info("retention_reask_skipped", conversation_id=snapshot.conversation_id)
    return result


def _call(
    llm: Any, settings: Settings, messages: list[Rendered], into: SummaryText, deadline: float
) -> None:
    """One summarizer call within the run's deadline, its reply and usage added to ``into``."""
    left = deadline - time.monotonic()
    if left < min(settings.llm_timeout, CALL_FLOOR_SECONDS, settings.run_seconds / 2):
        raise OutOfTime(
            f"the run's time is up: {max(left, 0):.0f} s of its {settings.run_seconds} s "
            "(RECAP_TASK_TIME_LIMIT) left, too little for a summarizer call"
        )
    try:
        reply = llm.complete(messages, settings, timeout=left)
    except llm.RetryableLLMError as exc:
        if left < settings.llm_timeout and time.monotonic() >= deadline - DEADLINE_SLACK_SECONDS:
            raise OutOfTime(
                f"the run's time ran out during a summarizer call cut to {left:.0f} s by its "
                f"{settings.run_seconds} s budget (RECAP_TASK_TIME_LIMIT): {exc}"
            ) from exc
        raise
    into.text = reply.text
    into.input_tokens += reply.input_tokens
    into.output_tokens += reply.output_tokens
    into.cost += reply.cost
    into.calls += 1
    into.requests.append(messages)


def _reask(
    llm: Any,
    settings: Settings,
    result: SummaryText,
    plan: compression.SummaryPlan,
    seed: str | None,
    missing: Sequence[str],
    wanted: set[str],
    count: compression.Counter,
    deadline: float,
) -> None:
    """Ask once more with the missing identifiers listed; keep the better of the two."""
    listed = compression.missing_within(missing, compression.RETENTION_LIST_TOKENS, count)
    messages = compression.build_summary_messages(
        prompt=settings.summary_prompt,
        previous_summary=seed,
        older=plan.chunks[-1],
        recent=plan.recent,
        missing=listed,
    )
    first_text, first_score = result.text, result.retention
    _call(llm, settings, messages, result, deadline)
    second = retention(wanted, result.text).score
    usable = compression.rejection_reason(result.text, summary_tokens=0, replaced_tokens=1) is None
    if usable and second > first_score:
        result.retention = second
    else:
        result.text, result.retention = first_text, first_score


# --- phase 3 -----------------------------------------------------------------------------------


def _insert_summary(connection: Any, values: dict[str, Any]) -> int | None:
    """Insert unless (conversation, cutoff) exists; the new id, or None on a conflict."""
    name = connection.dialect.name
    keys = ["conversation_id", "cutoff_message_id"]
    if name in ("sqlite", "postgresql"):
        from sqlalchemy.dialects import postgresql, sqlite

        dialect_insert = sqlite.insert if name == "sqlite" else postgresql.insert
        statement = (
            dialect_insert(SUMMARIES)
            .values(**values)
            .on_conflict_do_nothing(index_elements=keys)
            .returning(SUMMARIES.c.id)
        )
        row = connection.execute(statement).first()
        return int(row[0]) if row is not None else None
    try:
        with connection.begin_nested():
            result = connection.execute(insert(SUMMARIES).values(**values))
            return int(result.inserted_primary_key[0])
    except IntegrityError:
        return None


def _existing_summary(connection: Any, conversation_id: str, cutoff: int) -> int | None:
    c = SUMMARIES.c
    statement = select(c.id).where(
        c.conversation_id == conversation_id, c.cutoff_message_id == cutoff
    )
    value = connection.execute(statement).scalar()
    return int(value) if value is not None else None


def write_run(
    engine: Engine,
    run: Run,
    result: PassResult,
    *,
    held: lease.Lease | None,
    force_release: bool = False,
    duration_ms: int,
) -> tuple[Outcome, str]:
    """Phase 3 in one short transaction: the summary (a conflict means another run wrote it),
    the clearings a new summary makes free, the log row, and the lease let go (or kept when the
    conversation turned dirty: see ``lease.release_on``). Returns the outcome and lease state."""
    outcome = result.outcome
    now = run.clock()
    with session_scope(engine) as session:
        connection = session.connection()
        if result.row is not None:
            new_id = _insert_summary(connection, result.row)
            if new_id is None:
                cutoff = int(result.row["cutoff_message_id"])
                outcome = replace(
                    outcome,
                    action="skipped",
                    reason=f"already summarized up to message {cutoff} by another run",
                    summary_id=_existing_summary(connection, run.conversation_id, cutoff),
                )
            else:
                outcome = replace(outcome, summary_id=new_id)
                outcome = _clear_after_summary(session, run, outcome, result)
        log = _log_values(run, outcome, duration_ms, now)
        connection.execute(insert(COMPACTION_LOG).values(**log))
        if held is None:
            return outcome, "none"
        state = lease.release_on(connection, held, force=force_release, last_compacted_at=now)
    return outcome, state


def _log_values(run: Run, outcome: Outcome, duration_ms: int, now: datetime) -> dict[str, Any]:
    return {
        "conversation_id": run.conversation_id,
        "task_id": run.task_id,
        "trigger": run.trigger,
        "leaf_message_id": outcome.leaf_message_id,
        "action": outcome.action,
        "reason": outcome.reason,
        "tokens_before": outcome.tokens_before,
        "tokens_after": outcome.tokens_after,
        "summary_id": outcome.summary_id,
        "model": outcome.model,
        "input_tokens": outcome.input_tokens,
        "output_tokens": outcome.output_tokens,
        "cost": outcome.cost,
        "duration_ms": duration_ms,
        "error": (outcome.error or "")[:ERROR_CHARS] or None,
        "created_at": now,
    }


def _clear_after_summary(
    session: Session, run: Run, outcome: Outcome, result: PassResult
) -> Outcome:
    """A new summary changed the request's prefix, so its prompt cache is cold anyway: clear the
    old tool results after the cutoff now, when it costs nothing."""
    plan = toolresults.plan_clearings(
        result.recent,
        result.clearings,
        keep_last=run.settings.keep_tool_results,
        protected=run.settings.protected_tools,
        min_tokens=toolresults.min_tokens_for(toolresults.POST_SUMMARY, 0),
        reason=toolresults.POST_SUMMARY,
    )
    if not plan:
        return outcome
    applied = sweep.apply_clearings(session, run.conversation_id, plan, now=run.clock())
    if not applied.cleared:
        return outcome
    return replace(
        outcome,
        reason=f"{outcome.reason}, then cleared {applied.cleared} old tool results",
        tokens_after=outcome.tokens_after - applied.tokens_reclaimed,
    )


# --- one pass ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassResult:
    """One pass: its outcome, the summary row to insert, and (after a summary) the messages the
    request now carries after the new cutoff, with their clearings."""

    outcome: Outcome
    row: dict[str, Any] | None = None
    recent: tuple[Msg, ...] = ()
    clearings: Mapping[int, ClearingRec] = field(default_factory=dict)


@dataclass(frozen=True)
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


def one_pass(run: Run, snapshot: Snapshot | None = None) -> PassResult:
    """Read (unless given), decide and maybe summarize; the outcome and what to write."""
    if snapshot is None:
        snapshot = read_snapshot(run.engine, run.settings, run.conversation_id, run.leaf)
    params = snapshot.params
    before = params.effective_tokens
    base = Outcome("skipped", "", before, before, leaf_message_id=snapshot.leaf_id)
    if not run.force and not params.over_trigger:
        reason = f"under the trigger ({before} of {params.trigger_tokens} tokens)"
        return PassResult(replace(base, reason=reason))
    started = {k: v for k, v in _event_fields(run, base).items() if k != "action"}
    events.emit(run.settings, events.STARTED, **started, forced=run.force)
    if not run.force:
        pending = compression.pending_messages(snapshot.branch, snapshot.summary)
        cleared, reclaimed = clearing_step(
            run.engine, run.settings, run.conversation_id, pending, snapshot.clearings, run.clock()
        )
        if cleared and before - reclaimed <= params.trigger_tokens:
            reason = f"cleared {cleared} old tool results ({reclaimed} tokens)"
            after = before - reclaimed
            return PassResult(replace(base, action="cleared", reason=reason, tokens_after=after))
        if cleared:
            snapshot = read_snapshot(run.engine, run.settings, run.conversation_id, run.leaf)
    return summarize(run, snapshot, base)


def summarize(run: Run, snapshot: Snapshot, base: Outcome) -> PassResult:
    """Plan the split, call the summarizer (no session held), validate; the row to insert."""
    params = snapshot.params
    pending = compression.pending_messages(snapshot.branch, snapshot.summary)
    split = compression.plan_split(
        pending,
        recent_budget=params.recent_budget,
        recent_cap=params.recent_cap,
        keep_turns=params.keep_turns,
        clearings=snapshot.clearings,
    )
    if split is None:
        return PassResult(replace(base, reason="nothing older than the recent turns to summarize"))
    resting = None if run.force else _cooldown_reason(run, snapshot)
    if resting is not None:
        return PassResult(replace(base, reason=resting))
    try:
        if run.settings.summary_model:
            result = summarize_with_model(
                run.settings, snapshot, split, attempt=run.attempt, deadline=run.deadline
            )
        else:
            result = summarize_extractive(snapshot, split)
    except SummaryFailed as exc:
        return PassResult(replace(base, action="failed", reason=str(exc), error=str(exc)))
    return _validated(run, snapshot, split, result, base)


def _cooldown_reason(run: Run, snapshot: Snapshot) -> str | None:
    """Why the summarizer rests now after repeated failures, or None when it may run."""
    failures = snapshot.failures
    until = compression.cooldown_until(
        [f.at for f in failures],
        streak=run.settings.failure_streak,
        first_minutes=run.settings.failure_cooldown_minutes,
    )
    if until is None or run.clock() >= until:
        return None
    return (
        f"resting after {len(failures)} failed runs in a row (the last: "
        f"{failures[0].reason[:REASON_QUOTE_CHARS]}); the summarizer is tried again after "
        f"{until:%Y-%m-%d %H:%M} UTC, or now with force"
    )


def _validated(
    run: Run, snapshot: Snapshot, split: Split, result: SummaryText, base: Outcome
) -> PassResult:
    clearings = snapshot.clearings
    summary_tokens = tokens.count_message(
        {"role": "user", "content": SUMMARY_MESSAGE_PREFIX + result.text}, snapshot.encoding
    )
    replaced = (snapshot.summary.tokens if snapshot.summary else 0) + sum(
        compression.message_tokens(m, clearings) for m in split.older
    )
    base = replace(
        base,
        model=result.model,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        cost=result.cost,
    )
    problem = compression.rejection_reason(
        result.text, summary_tokens=summary_tokens, replaced_tokens=replaced
    )
    if problem is not None:
        reason = f"summary rejected: {problem}"
        return PassResult(replace(base, action="failed", reason=reason, error=reason))
    after = base.tokens_before - replaced + summary_tokens
    outcome = replace(
        base,
        action="summarized",
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
        "encoding": snapshot.encoding,
        "model": result.model,
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "identifier_retention": result.retention,
        "created_at": run.clock(),
    }
    return PassResult(outcome, row, split.recent, snapshot.clearings)


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
) -> dict[str, Any]:
    """One ``compress_session`` run under the conversation's lease; the contract's JSON.

    Raises ``NotFoundError`` for an unknown conversation or leaf, and ``RetryLater`` when the
    model failed in a way worth retrying and attempts are left (the lease is released first).
    """
    started = time.monotonic()
    deadline = started + settings.run_seconds
    run = Run(
        engine,
        settings,
        conversation_id,
        leaf_message_id,
        force,
        attempt,
        trigger,
        task_id,
        clock,
        deadline,
    )
    claimed = claim(engine, settings, run)
    if claimed is None:
        return _busy(run, started)
    held, snapshot = claimed
    try:
        outcome = _passes(run, held, snapshot, started)
    except BaseException as exc:
        lease.release(engine, held, force=True)
        if isinstance(exc, RetryLater):
            _log_retry(run, exc, started)
        raise
    fields = {**_event_fields(run, outcome), "reason": outcome.reason}
    fields["duration_ms"] = _ms(started)
    events.emit(
        settings, events.FAILED if outcome.action == "failed" else events.COMPLETED, **fields
    )
    return outcome.as_dict()


def _passes(run: Run, held: lease.Lease, snapshot: Snapshot, started: float) -> Outcome:
    """The first pass, then a re-check for each time the conversation turned dirty meanwhile."""
    first: Outcome | None = None
    current: Run = run
    given: Snapshot | None = snapshot
    for number in range(MAX_PASSES):
        result = one_pass(current, given)
        given = None
        outcome = result.outcome
        out_of_time = time.monotonic() >= run.deadline  # a dirty flag is left for reconcile
        last = number == MAX_PASSES - 1 or outcome.action == "failed" or out_of_time
        if number == 0 or outcome.action != "skipped" or result.row is not None:
            outcome, state = write_run(
                run.engine, current, result, held=held, force_release=last, duration_ms=_ms(started)
            )
        else:
            state = lease.release(run.engine, held, force=last)
        first = _merge(first, outcome)
        if state != "dirty":
            break
        current = replace(run, leaf=None, force=False, trigger="recheck")
    assert first is not None
    return first


def _merge(first: Outcome | None, later: Outcome) -> Outcome:
    """The run's result: the first pass that acted, with the latest token count."""
    if first is None:
        return later
    if first.action == "skipped" and later.action != "skipped":
        return later
    return replace(first, tokens_after=later.tokens_after)


def _busy(run: Run, started: float) -> dict[str, Any]:
    outcome = Outcome("busy", "another run holds this conversation; it will re-check", 0, 0)
    events.emit(
        run.settings, events.COMPLETED, **_event_fields(run, outcome), duration_ms=_ms(started)
    )
    return outcome.as_dict()


def _log_retry(run: Run, exc: RetryLater, started: float) -> None:
    events.log.warning(
        "compression_retry",
        conversation_id=run.conversation_id,
        task_id=run.task_id,
        attempt=run.attempt + 1,
        delay_s=round(exc.delay, 2),
        error=exc.reason,
        duration_ms=_ms(started),
    )
    outcome = Outcome("retry", f"retrying in {exc.delay:.1f} s", 0, 0, error=exc.reason)
    write_run(run.engine, run, PassResult(outcome), held=None, duration_ms=_ms(started))


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def run_with_retries(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf_message_id: int | None = None,
    force: bool = False,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """``compress_session`` in this process, retrying in place (the CLI has no Celery to do it)."""
    for attempt in range(settings.max_attempts):
        try:
            return compress_session(
                engine,
                settings,
                conversation_id,
                leaf_message_id,
                force,
                attempt=attempt,
                trigger="manual" if force else "cli",
            )
        except RetryLater as exc:
            sleep(exc.delay)
    raise AssertionError("unreachable: the last attempt never raises RetryLater")


# --- reconcile ---------------------------------------------------------------------------------


def reconcile(
    engine: Engine,
    settings: Settings,
    enqueue: Callable[[str], object],
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Re-enqueue conversations still over their trigger whose last run is missing (activity
    since it, or a dirty flag nobody picked up) or whose lease expired (the run died)."""
    moment = now or utcnow()
    c = CONVERSATIONS.c
    free = or_(c.lease_owner.is_(None), c.lease_expires_at < moment)
    stale = or_(
        c.dirty.is_(True),
        c.lease_owner.is_not(None),
        c.last_compacted_at.is_(None),
        c.last_compacted_at < c.last_activity_at,
    )
    statement = select(c.id, c.dirty).where(free, stale).order_by(c.last_activity_at)
    with session_scope(engine) as session:
        rows = list(session.connection().execute(statement.limit(RECONCILE_BATCH)))
    enqueued = 0
    for conversation_id, dirty in rows:
        if dirty or _over_trigger(engine, settings, conversation_id):
            enqueue(conversation_id)
            enqueued += 1
        else:
            _mark_checked(engine, conversation_id, moment)
    return {"enqueued": enqueued}


def _over_trigger(engine: Engine, settings: Settings, conversation_id: str) -> bool:
    try:
        snapshot = read_snapshot(engine, settings, conversation_id, None, with_failures=False)
        return snapshot.params.over_trigger
    except tokens.UnknownModelError:
        return False


def _mark_checked(engine: Engine, conversation_id: str, now: datetime) -> None:
    """Under its trigger: note the check and drop a dead run's lease, so the next pass skips it."""
    c = CONVERSATIONS.c
    with session_scope(engine) as session:
        session.connection().execute(
            update(CONVERSATIONS)
            .where(c.id == conversation_id, or_(c.lease_owner.is_(None), c.lease_expires_at < now))
            .values(last_compacted_at=now, lease_owner=None, lease_expires_at=None)
        )
