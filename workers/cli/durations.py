"""Look-back durations such as ``30m``, ``2h`` or ``7d``, for ``recap failures --since`` and
``recap retry --since``."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

import typer

DURATION_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}  # seconds per unit
MAX_DURATION_DAYS = 3_650  # ten years: a longer look-back is a typo, and overflows a datetime
SinceOption = Annotated[
    str,
    typer.Option("--since", help="How far back to look: 30m, 2h, 7d (s, m, h, d or w)."),
]


def parse_duration(text: str) -> timedelta:
    """``30m``, ``2h``, ``7d`` as a positive timedelta; ``InputError`` for anything else."""
    from recap.core.errors import InputError

    match = re.fullmatch(r"\s*(\d{1,7}(?:\.\d{1,6})?)\s*([smhdw])\s*", text.lower())
    seconds = float(match[1]) * DURATION_UNITS[match[2]] if match else 0.0
    if not match or seconds <= 0 or seconds > MAX_DURATION_DAYS * DURATION_UNITS["d"]:
        raise InputError(
            f"--since: expected a positive duration like 30m, 2h or 7d (at most "
            f"{MAX_DURATION_DAYS} days), got {text!r}"
        )
    return timedelta(seconds=seconds)
