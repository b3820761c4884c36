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

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache, partial
from typing import Any

from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlmodel import Session

from core.counting import tokens
from core.decision import policy
from core.decision.toolresults import ClearingPlan
from core.errors import NotFoundError
from core.redact import known_secrets, redact
from core.settings import Settings
from core.storage import compaction_log, sweep
from core.storage import snapshot as snapshots
from core.storage.db import session_scope
from core.storage.models import CONVERSATIONS, SUMMARIES, CompactionLog, table_of, utcnow
from core.storage.records import ClearingRec, Msg
from core.summaries import compression
from core.summaries.compression import Rendered, Split
from core.summaries.extractive import extractive_summary
from core.summaries.identifiers import identifiers_of_span, retention
from core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from workers import events, lease
from workers.reconcile import reconcile  # noqa: F401  (reconcile's home; importable here too)

COMPACTION_LOG = table_of(CompactionLog)
EXTRACTIVE_MODEL = "extractive"
MAX_PASSES = 3  # the first pass plus up to two re-checks when new turns arrived meanwhile
MAX_SHRINKS = 2  # a context-window error halves the summarizer's assumed window, at most twice
ERROR_CHARS = 500  # an error stored in the log is cut here
# An unknown summary model (a local model, a proxy alias) is assumed to take 8k tokens, which any
# current chat model does; a context-window error from it halves the assumption.
FALLBACK_SUMMARIZER_WINDOW = 8_192
COUNT_CACHE_SIZE = 4_096  # rendered messages whose token counts are kept
# A model call is started only with this much of the run's time left (less when RECAP_LLM_TIMEOUT
# or half the run is less): a summary cut off by the deadline is paid for and thrown away.
CALL_FLOOR_SECONDS = 10
DEADLINE_SLACK_SECONDS = 0.5  # a timeout this close to the deadline is the deadline's doing
BUSY_FIRST_PAUSE = 0.05  # a host waiting for a worker's run checks the lease this soon
BUSY_MAX_PAUSE = 1.0  # and then at most this far apart

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


Snapshot = policy.Snapshot  # what a run decides from (no message text) and summarizes with
Failure = policy.Failure


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


# --- phase 1: claim, then read -----------------------------------------------------------------


def read_snapshot(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf: int | None,
    *,
    with_failures: bool = True,
    now: datetime | None = None,
) -> Snapshot:
    """One short read session of the content-free snapshot (``core.storage.snapshot``);
    ``with_failures`` reads the failed runs the cooldown needs."""
    failures = settings.failure_streak if with_failures else 0
    with session_scope(engine) as session:
        return snapshots.read_snapshot(
            session, conversation_id, leaf, now=now or utcnow(), failures=failures
        )


def early_skip(
    engine: Engine, settings: Settings, conversation_id: str, now: datetime
) -> tuple[policy.Decision, int | None] | None:
    """The decision's skip when an upper bound on the latest branch's history is under the
    trigger (two aggregate reads, no message row), with the latest message id; else None."""
    knobs = policy.Knobs.from_settings(settings)
    with session_scope(engine) as session:
        bound = snapshots.history_bound(session, conversation_id)
        if bound is None:
            return None
        head = snapshots.head_snapshot(session, conversation_id, now=now)
    decision = policy.early_skip(head, knobs, bound[0])
    return (decision, bound[1]) if decision is not None else None


def claim(
    engine: Engine, settings: Settings, run: Run
) -> tuple[lease.Lease, Snapshot | None] | None:
    """Take the conversation's lease in one short transaction, committed before anything is
    read (the snapshot is read by the first pass: None here); None, with the conversation
    marked dirty for its holder, when another run holds it."""
    owner = lease.new_owner()
    now = run.clock()
    cid = run.conversation_id
    if run.leaf is not None:  # an unknown leaf is the caller's error: no lease taken for it
        with session_scope(engine) as session:
            snapshots.check_leaf(session, cid, run.leaf)
    for _ in range(lease.ACQUIRE_TRIES):
        with session_scope(engine) as session:
            connection = session.connection()
            held = lease.take(connection, cid, owner=owner, now=now, seconds=settings.lease_seconds)
            if held is None:
                exists = select(CONVERSATIONS.c.id).where(CONVERSATIONS.c.id == cid)
                if connection.execute(exists).first() is None:
                    raise NotFoundError(f"unknown conversation {cid!r}")
                if lease.mark_dirty(connection, cid, now):
                    return None
        if held is not None:
            return held, None
    return None


# --- the clearing step -------------------------------------------------------------------------


def clearing_step(
    engine: Engine, conversation_id: str, plan: ClearingPlan, now: datetime
) -> tuple[int, int]:
    """Record a decision's clearings; (results newly cleared, tokens they reclaim)."""
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

# A write that fails because the database is unreachable (a restart, a failover) is tried again
# with the summary kept in memory: waits from DB_RETRY_FIRST_SECONDS doubling to
# DB_RETRY_MAX_SECONDS, for at most DB_RETRY_WINDOW_SECONDS and never past the lease's expiry
# less LEASE_SAFETY_SECONDS; after that the run fails to Celery, which retries it with backoff.
DB_RETRY_FIRST_SECONDS = 0.25  # a restart drops connections for a second or two
DB_RETRY_MAX_SECONDS = 4.0  # one wait between write attempts is at most this
DB_RETRY_WINDOW_SECONDS = 60.0  # long enough for a database restart or a managed failover
LEASE_SAFETY_SECONDS = 5.0  # stop retrying while the lease is surely still ours
# SQLSTATE classes of a database that is not there: connection exceptions (08xxx) and an
# operator's intervention (57Pxx: shutting down, starting up, crash recovery).
UNAVAILABLE_SQLSTATES = ("08", "57P")


def database_unavailable(exc: BaseException) -> bool:
    """Whether a database error means "not reachable right now" (worth retrying), not a bad
    statement or data."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    if state:
        return str(state).startswith(UNAVAILABLE_SQLSTATES)
    message = str(exc.orig).lower()
    return "no such" not in message and "syntax" not in message  # SQLite: locked, I/O


def _retry_window(run: Run, held: lease.Lease | None) -> float:
    if held is None:
        return DB_RETRY_WINDOW_SECONDS
    left = (held.expires_at - run.clock()).total_seconds() - LEASE_SAFETY_SECONDS
    return max(0.0, min(DB_RETRY_WINDOW_SECONDS, left))


def durably(run: Run, held: lease.Lease | None, write: Callable[[], Any], what: str) -> Any:
    """``write()``, tried again with backoff while the database is unavailable, within the
    retry window (see above); the last error is raised when the window is spent."""
    ends = time.monotonic() + _retry_window(run, held)
    wait = DB_RETRY_FIRST_SECONDS
    for tries in range(1, 1_000_000):
        try:
            return write()
        except DBAPIError as exc:
            left = ends - time.monotonic()
            if not database_unavailable(exc) or left <= 0:
                raise
            events.log.warning(
                "database_unavailable_retrying",
                conversation_id=run.conversation_id,
                task_id=run.task_id,
                step=what,
                tries=tries,
                wait_s=round(min(wait, left), 2),
                error=_first_line(exc),
            )
            time.sleep(min(wait, left))
            wait = min(wait * 2, DB_RETRY_MAX_SECONDS)
    raise AssertionError("unreachable")


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _db_retry(run: Run, exc: DBAPIError) -> RetryLater | None:
    """A database that stayed unavailable: a Celery retry with backoff while attempts are left
    (None: let the error end the run)."""
    if not database_unavailable(exc) or run.attempt + 1 >= run.settings.max_attempts:
        return None
    ceiling = min(run.settings.retry_backoff_max, DB_RETRY_MAX_SECONDS * 2**run.attempt)
    return RetryLater(
        f"the database is unavailable: {_first_line(exc)}", random.uniform(ceiling / 2, ceiling)
    )


def _release_after_failure(run: Run, held: lease.Lease, exc: BaseException) -> None:
    """A run that raised lets its lease go (retried while the database is away) and says so; a
    release that still fails leaves the lease to expire, and reconcile to pick it up."""
    try:
        state = durably(run, held, lambda: lease.release(run.engine, held, force=True), "release")
    except Exception as release_error:  # best effort: the run's own error is what is raised
        state = f"not released ({_first_line(release_error)}); it expires at {held.expires_at}"
    if not isinstance(exc, RetryLater):
        events.log.error(
            "compression_run_error",
            conversation_id=run.conversation_id,
            task_id=run.task_id,
            error=_first_line(exc),
            lease=state,
        )


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
        compaction_log.record_run(connection, log)  # a skip after a skip: counted on its row
        if held is None:
            return outcome, "none"
        state = lease.release_on(connection, held, force=force_release, last_compacted_at=now)
    return outcome, state


def _log_values(run: Run, outcome: Outcome, duration_ms: int, now: datetime) -> dict[str, Any]:
    secrets = known_secrets(run.settings)
    return {
        "conversation_id": run.conversation_id,
        "task_id": run.task_id,
        "trigger": run.trigger,
        "leaf_message_id": outcome.leaf_message_id,
        "action": outcome.action,
        "reason": redact(outcome.reason, secrets),  # the row is a sink too: masked before stored
        "tokens_before": outcome.tokens_before,
        "tokens_after": outcome.tokens_after,
        "summary_id": outcome.summary_id,
        "model": outcome.model,
        "input_tokens": outcome.input_tokens,
        "output_tokens": outcome.output_tokens,
        "cost": outcome.cost,
        "duration_ms": duration_ms,
        "error": redact(outcome.error or "", secrets)[:ERROR_CHARS] or None,
        "created_at": now,
    }


def _clear_after_summary(
    session: Session, run: Run, outcome: Outcome, result: PassResult
) -> Outcome:
    """A new summary changed the request's prefix, so its prompt cache is cold anyway: clear the
    old tool results after the cutoff now, when it costs nothing."""
    knobs = policy.Knobs.from_settings(run.settings)
    plan = policy.post_summary_clearing(result.recent, result.clearings, knobs)
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
    """Read (unless given), decide (``core.decision.policy``), clear and maybe summarize; the
    outcome and what to write. Without a leaf or force, a conversation far under its trigger is
    skipped from two aggregates before its branch is read."""
    knobs = policy.Knobs.from_settings(run.settings)
    if snapshot is None:
        if run.leaf is None and not run.force:
            early = early_skip(run.engine, run.settings, run.conversation_id, run.clock())
            if early is not None:
                decision, leaf = early
                size = decision.pressure.history
                skipped = Outcome("skipped", decision.reason, size, size, leaf_message_id=leaf)
                return PassResult(skipped)
        snapshot = read_snapshot(
            run.engine, run.settings, run.conversation_id, run.leaf, now=run.clock()
        )
    decision = policy.decide(snapshot, knobs, force=run.force)
    before = decision.pressure.history
    base = Outcome("skipped", "", before, before, leaf_message_id=snapshot.leaf_id)
    if decision.action == policy.SKIP and not decision.pressure.over_trigger and not run.force:
        return PassResult(replace(base, reason=decision.reason))
    started = {k: v for k, v in _event_fields(run, base).items() if k != "action"}
    events.emit(run.settings, events.STARTED, **started, forced=run.force, urgent=decision.urgent)
    if decision.clear:
        cleared, reclaimed = clearing_step(
            run.engine, run.conversation_id, decision.clear, run.clock()
        )
        after = before - decision.pressure.budget.history(reclaimed)
        if decision.action == policy.CLEAR and cleared:
            reason = f"cleared {cleared} old tool results ({reclaimed} tokens)"
            return PassResult(replace(base, action="cleared", reason=reason, tokens_after=after))
        base = replace(base, tokens_after=after)
    if decision.action != policy.SUMMARIZE or decision.split is None:
        return PassResult(replace(base, reason=decision.reason))
    return summarize(run, replace(snapshot, clearings=decision.clearings), decision, base)


def with_text(engine: Engine, conversation_id: str, split: Split) -> Split:
    """The split with its messages' text: the only content a run reads."""
    ids = [m.id for m in (*split.older, *split.recent)]
    with session_scope(engine) as session:
        rows = snapshots.load_contents(session, conversation_id, ids)
    return Split(
        tuple(rows[m.id] for m in split.older),
        tuple(rows[m.id] for m in split.recent),
        split.at_user,
    )


def summarize(run: Run, snapshot: Snapshot, decision: policy.Decision, base: Outcome) -> PassResult:
    """Read the split's text, call the summarizer (no session held), validate; the row to
    insert."""
    assert decision.split is not None
    split = with_text(run.engine, run.conversation_id, decision.split)
    try:
        if run.settings.summary_model:
            result = summarize_with_model(
                run.settings, snapshot, split, attempt=run.attempt, deadline=run.deadline
            )
        else:
            result = summarize_extractive(snapshot, split)
    except SummaryFailed as exc:  # a provider's error can quote the key: masked here
        reason = redact(str(exc), known_secrets(run.settings))
        return PassResult(replace(base, action="failed", reason=reason, error=reason))
    return _validated(run, snapshot, split, result, base)


def _validated(
    run: Run, snapshot: Snapshot, split: Split, result: SummaryText, base: Outcome
) -> PassResult:
    clearings = snapshot.clearings
    encoding = tokens.encoding_name_for(snapshot.model)
    summary_tokens = tokens.count_message(
        {"role": "user", "content": SUMMARY_MESSAGE_PREFIX + result.text}, encoding
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
    after = base.tokens_after - replaced + summary_tokens
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
        "encoding": encoding,
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
    try:
        claimed = claim(engine, settings, run)
    except DBAPIError as exc:  # the read failed: Celery tries again later
        retry = _db_retry(run, exc)
        if retry is None:
            raise
        _log_retry_if_possible(run, retry, started)
        raise retry from exc
    if claimed is None:
        return _busy(run, started)
    held, snapshot = claimed
    try:
        outcome = _passes(run, held, snapshot, started)
    except BaseException as exc:
        _release_after_failure(run, held, exc)
        later = _db_retry(run, exc) if isinstance(exc, DBAPIError) else exc
        if not isinstance(later, RetryLater):
            raise
        _log_retry_if_possible(run, later, started)
        if later is exc:
            raise
        raise later from exc
    fields = {**_event_fields(run, outcome), "reason": outcome.reason}
    fields["duration_ms"] = _ms(started)
    events.emit(
        settings, events.FAILED if outcome.action == "failed" else events.COMPLETED, **fields
    )
    return outcome.as_dict()


def _passes(run: Run, held: lease.Lease, snapshot: Snapshot | None, started: float) -> Outcome:
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
            write = partial(write_run, run.engine, current, result, held=held, force_release=last)
            outcome, state = durably(run, held, partial(write, duration_ms=_ms(started)), "write")
        else:
            state = durably(
                run, held, partial(lease.release, run.engine, held, force=last), "release"
            )
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
    reason = redact(exc.reason, known_secrets(run.settings))
    events.log.warning(
        "compression_retry",
        conversation_id=run.conversation_id,
        task_id=run.task_id,
        attempt=run.attempt + 1,
        delay_s=round(exc.delay, 2),
        error=reason,
        duration_ms=_ms(started),
    )
    outcome = Outcome("retry", f"retrying in {exc.delay:.1f} s", 0, 0, error=reason)
    write_run(run.engine, run, PassResult(outcome), held=None, duration_ms=_ms(started))


def _log_retry_if_possible(run: Run, exc: RetryLater, started: float) -> None:
    """``_log_retry``, whose row cannot be written while the database is away (the log line
    still is)."""
    try:
        _log_retry(run, exc, started)
    except DBAPIError as error:
        if not database_unavailable(error):
            raise


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def compress_now(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf_message_id: int | None = None,
    force: bool = False,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """``run_with_retries`` for a host that needs the next request to fit: when another run
    holds the lease, wait for it to let go (at most a lease's lifetime), then run once more."""
    result = run_with_retries(engine, settings, conversation_id, leaf_message_id, force)
    if result["action"] != "busy":
        return result
    give_up = time.monotonic() + settings.lease_seconds
    pause = BUSY_FIRST_PAUSE
    while time.monotonic() < give_up:
        sleep(pause)
        pause = min(pause * 2, BUSY_MAX_PAUSE)
        if lease.is_free(engine, conversation_id, utcnow()):
            result = run_with_retries(engine, settings, conversation_id, leaf_message_id, force)
            if result["action"] != "busy":
                return result
    return result


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
