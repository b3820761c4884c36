"""The beat's maintenance, run now from the command line: ``sweep`` (clear old tool results of
idle conversations), ``cleanup`` (delete old saved tool outputs) and ``prune-log`` (delete old
compaction-log rows)."""

from __future__ import annotations

from typing import Annotated

import typer

from recap.workers.cli.common import emit, engine, settings, table
from recap.workers.cli.errors import handles_errors
from recap.workers.cli.options import MAX_DAYS, JsonFlag, finite


@handles_errors
def sweep(
    idle_minutes: Annotated[
        float | None,
        typer.Option(
            help="Idle time before clearing (default: RECAP_IDLE_MINUTES; 0 clears now).",
            parser=finite(0, MAX_DAYS * 24 * 60, open_low=False),
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Clear old tool results of idle conversations now (the beat sweep, all batches)."""
    from recap.core.service import maintenance

    result = maintenance.sweep(engine(), settings(), idle_minutes=idle_minutes)
    payload = result.as_dict()
    emit(payload, as_json, lambda: table("sweep", list(payload), [list(payload.values())]))


@handles_errors
def cleanup(
    retention_days: Annotated[
        float | None,
        typer.Option(
            help="Keep saved outputs this long (default: RECAP_OUTPUT_RETENTION_DAYS).",
            parser=finite(0, MAX_DAYS, open_low=False),
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete saved tool outputs older than the retention now (the beat cleanup)."""
    from recap.core.service import maintenance

    result = maintenance.cleanup(settings(), retention_days=retention_days)
    payload = result.as_dict()
    emit(payload, as_json, lambda: table("cleanup", list(payload), [list(payload.values())]))


@handles_errors
def prune_log(as_json: JsonFlag = False) -> None:
    """Delete compaction-log rows past RECAP_LOG_RETENTION_DAYS (skipped runs) and
    RECAP_LOG_HISTORY_DAYS (every run) now (the beat pruning)."""
    from recap.core.service import maintenance

    result = maintenance.prune_log(engine(), settings())
    payload = result.as_dict()
    emit(payload, as_json, lambda: table("prune-log", list(payload), [list(payload.values())]))
