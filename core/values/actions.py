"""What a compression run did: one name per outcome, from the run to the log, the task's result,
the CLI and the host API (a ``StrEnum``, so each value is also the plain string the contract's JSON
and the compaction log carry)."""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The ``action`` of a run's result and of its compaction-log row."""

    SUMMARIZED = "summarized"  # a summary was written (clearings may have come first or after)
    CLEARED = "cleared"  # old tool results were cleared, and that was enough
    SKIPPED = "skipped"  # nothing to do (under the trigger, cooling down, done by another run)
    FAILED = "failed"  # the summarizer gave up or its summary was rejected; nothing stored
    BUSY = "busy"  # another run holds the conversation's lease; it re-checks when done
    RETRY = "retry"  # a retryable error: Celery runs the task again after a delay


SETTLING = (Action.FAILED, Action.SUMMARIZED, Action.CLEARED)  # runs that end a failure streak
ACTED = frozenset({Action.SUMMARIZED, Action.CLEARED})  # runs that did something about pressure
