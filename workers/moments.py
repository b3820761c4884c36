"""``--as-of TIME`` on the command line: an ISO 8601 moment, UTC unless it says otherwise."""

from __future__ import annotations

from datetime import UTC, datetime

import typer


def parse_moment(text: str) -> datetime:
    """An ISO 8601 date or time (``2025-06-01``, ``2025-06-01T12:30:00Z``, with an offset or
    without: then UTC), as an aware datetime; one clear error otherwise."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO 8601 time such as 2025-06-01T12:30:00Z"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
