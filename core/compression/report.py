"""What a compression run reports as it goes: one protocol, and the log-only reporter.

A run emits ``STARTED`` when it decides to act and one canonical ``COMPLETED`` or ``FAILED`` line
when it ends (a run with nothing to do emits only the canonical line), each with its fields;
every text field is masked (``core.redact``) before it leaves. ``LogReporter`` writes them as
structlog lines; the workers' reporter (``workers.events``) also publishes them on Redis for hosts
that show a "compressing..." toast.
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog

from recap.core.redact import known_secrets, redact
from recap.core.settings import Settings

STARTED = "compression_started"
COMPLETED = "compression_completed"
FAILED = "compression_failed"
# A run asked the provider to compact its span (``core.compression.provider``): outcome ok, or
# failed (logged as a warning; the readable summary is kept either way).
PROVIDER_COMPACTION = "provider_compaction"

DELETED_REASON = "the conversation was deleted during the run; nothing was written"
RECREATED_REASON = (
    "the conversation was deleted during the run and its id created again; nothing was written"
)
log = structlog.get_logger("recap.compress")


class Reporter(Protocol):
    """Where a run's events go."""

    def emit(self, settings: Settings, event: str, **fields: Any) -> None: ...


def masked(settings: Settings, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every string masked of the known secrets."""
    secrets = known_secrets(settings)
    return {k: redact(v, secrets) if isinstance(v, str) else v for k, v in fields.items()}


class LogReporter:
    """Each event as one structlog line: the run's canonical line (``COMPLETED``, or ``FAILED``
    as a warning) at info, ``STARTED`` at debug (it is for subscribers, not for the log)."""

    def emit(self, settings: Settings, event: str, **fields: Any) -> None:
        level = {FAILED: log.warning, STARTED: log.debug}.get(event, log.info)
        if event == PROVIDER_COMPACTION and fields.get("outcome") != "ok":
            level = log.warning
        level(event, **masked(settings, fields))
