"""The summarizer a compression run calls: one protocol, its result value, and its errors.

The run (``core.compression.run``) knows only ``Summarizer``: the offline extractive summary lives
here, the model-calling one is a transport outside ``core`` (``workers.summarizers``, through
litellm), and a host may pass its own. ``Summarizers`` is how a run gets one for an attempt: the
settings, the attempt number and the run's deadline in, a summarizer out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from recap.core.decision import policy
from recap.core.settings import Settings
from recap.core.summaries.extractive import extractive_summary
from recap.core.summaries.identifiers import identifiers_of_span, retention
from recap.core.summaries.planning import Split

EXTRACTIVE_MODEL = "extractive"


class RetryLater(Exception):
    """A retryable error: the task should run again after ``delay`` seconds."""

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


@dataclass(kw_only=True)
class SummaryText:
    """A summarizer's result, before it is stored."""

    text: str
    model: str
    retention: float
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    calls: int = 0
    cached_input_tokens: int = 0  # the part of the input read from the provider's cache


class Summarizer(Protocol):
    """Summarizes a split's older part (text read) into the snapshot's previous summary.

    Raises ``RetryLater`` for an error worth retrying while attempts are left, ``SummaryFailed``
    otherwise; it is called with no database session held."""

    def summarize(self, snapshot: policy.Snapshot, split: Split) -> SummaryText: ...


# (settings, attempt, deadline as time.monotonic()) -> the summarizer for that attempt
Summarizers = Callable[[Settings, int, float], Summarizer]


class ExtractiveSummarizer:
    """The offline summary of the older part, merged into the previous summary."""

    def summarize(self, snapshot: policy.Snapshot, split: Split) -> SummaryText:
        previous = snapshot.summary.text if snapshot.summary else None
        text = extractive_summary(
            split.older, previous_summary=previous, clearings=snapshot.clearings
        )
        score = retention(identifiers_of_span(split.older), text).score
        return SummaryText(text=text, model=EXTRACTIVE_MODEL, retention=score)


def offline(settings: Settings, attempt: int, deadline: float) -> Summarizer:
    """``Summarizers`` of a core that has no model transport: the extractive summary, and a clear
    error when a summary model is configured (it would be silently ignored otherwise)."""
    if settings.summary_model:
        raise SummaryFailed(
            f"RECAP_SUMMARY_MODEL is {settings.summary_model!r} but no model summarizer is "
            "installed (the recap distribution provides one through litellm)"
        )
    return ExtractiveSummarizer()
