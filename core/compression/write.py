"""Phase 3 of a compression run: its one short write transaction (the summary, the clearings a
new summary makes free, the log row, the lease let go), written so that it outlasts a database
restart within the lease, and the lease let go after a failure."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.exc import DBAPIError

from recap.core import tracing
from recap.core.compression import report
from recap.core.compression.dbretry import (
    DB_RETRY_MAX_SECONDS,
    database_unavailable,
    durably,
    first_line,
)
from recap.core.compression.dbretry import retry_window as _window
from recap.core.compression.summarizer import (
    RetryLater,
)
from recap.core.decision import policy
from recap.core.redact import known_secrets, redact
from recap.core.results import CompressResult
from recap.core.storage import lease, store
from recap.core.storage.summaries import Written
from recap.core.storage.summaries import write_run as write_transaction
from recap.core.values.actions import Action

if TYPE_CHECKING:
    from recap.core.compression.run import PassResult, Run

ERROR_CHARS = 500  # an error stored in the log is cut here
SOURCE_GONE_REASON = (
    "a conversation it attaches was erased during the run; no summary was written (the next "
    "run summarizes the attachment's fallback)"
)
Outcome = CompressResult  # what one run did: the contract's JSON plus what the log row records
T = TypeVar("T")


@tracing.traced("recap.compress.write")
def write_run(
    run: Run,
    result: PassResult,
    *,
    held: lease.Lease | None,
    force_release: bool = False,
    duration_ms: int,
) -> tuple[Outcome, str]:
    """Phase 3 in one short transaction (``core.storage.summaries.write_run``): the summary, the
    clearings a new summary makes free, the log row, and the lease let go (or kept when the
    conversation turned dirty). Returns the outcome and the lease's state."""
    now = run.clock()
    clear_after = None
    if result.row is not None:
        clear_after = policy.post_summary_clearing(
            result.recent, result.clearings, run.knobs, result.pinned
        )

    def log_row(written: Written) -> dict[str, Any]:
        return _log_values(run, _written(result.outcome, written, result.row), duration_ms, now)

    written = write_transaction(
        run.engine,
        store.Identity(run.conversation_id, run.incarnation),
        summary=result.row,
        sources=result.sources,
        clear_after=clear_after,
        log_row=log_row,
        held=held,
        force_release=force_release,
        now=now,
    )
    return _written(result.outcome, written, result.row), written.lease


def _written(outcome: Outcome, written: Written, row: Mapping[str, Any] | None) -> Outcome:
    """The pass's outcome once its summary is written: its id, a conflict with another run, or
    the tool results cleared after it."""
    if row is None:
        return outcome
    if written.source_gone:
        return replace(  # the summary's saving not made: counted as before the run
            outcome,
            action=Action.SKIPPED,
            reason=SOURCE_GONE_REASON,
            summary_id=None,
            cutoff_message_id=None,
            tokens_after=outcome.tokens_before,
        )
    if written.conflict:
        cutoff = row["cutoff_message_id"]
        return replace(
            outcome,
            action=Action.SKIPPED,
            reason=f"already summarized up to message {cutoff} by another run",
            summary_id=written.summary_id,
        )
    outcome = replace(outcome, summary_id=written.summary_id)
    if not written.cleared:
        return outcome
    return replace(
        outcome,
        reason=f"{outcome.reason}, then {written.steps}",
        tokens_after=outcome.tokens_after
        - math.ceil(written.tokens_reclaimed * outcome.calibration),
    )


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
        "cached_input_tokens": outcome.cached_input_tokens,
        "cost": outcome.cost,
        "duration_ms": duration_ms,
        "error": redact(outcome.error or "", secrets)[:ERROR_CHARS] or None,
        "created_at": now,
    }


def durably_within_lease(
    run: Run, held: lease.Lease | None, write: Callable[[], T], step: str
) -> T:
    """``write()`` retried while the database is away (``workers.dbretry.durably``), never past
    the point where the lease might no longer be ours."""
    window = _window(held.expires_at if held else None, run.clock())
    fields = {"conversation_id": run.conversation_id, "task_id": run.task_id}
    return durably(write, window=window, step=step, **fields)


def retry_for_database(run: Run, exc: DBAPIError) -> RetryLater | None:
    """A database that stayed unavailable: a Celery retry with backoff while attempts are left
    (None: let the error end the run)."""
    if not database_unavailable(exc) or run.attempt + 1 >= run.settings.max_attempts:
        return None
    ceiling = min(run.settings.retry_backoff_max, DB_RETRY_MAX_SECONDS * 2**run.attempt)
    return RetryLater(
        f"the database is unavailable: {first_line(exc)}", random.uniform(ceiling / 2, ceiling)
    )


def release_after_failure(run: Run, held: lease.Lease, exc: BaseException) -> None:
    """A run that raised lets its lease go (retried while the database is away) and says so; a
    release that still fails leaves the lease to expire, and reconcile to pick it up."""
    try:
        state = durably_within_lease(
            run, held, partial(lease.release, run.engine, held, force=True), "release"
        )
    except Exception as release_error:  # best effort: the run's own error is what is raised
        state = f"not released ({first_line(release_error)}); it expires at {held.expires_at}"
    if not isinstance(exc, RetryLater):
        report.log.error(
            "compression_run_error",
            conversation_id=run.conversation_id,
            task_id=run.task_id,
            error=first_line(exc),
            lease=state,
        )
