"""The options several commands share (``--json``, ``--leaf``, ``--max-input-tokens``,
``--as-of``) and the bounds of their values."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Annotated

import typer

from recap.core.values.limits import INT32_MAX, MESSAGE_ID_MAX, TOKENS_MAX
from recap.workers import moments

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]

# Every integer option is bounded by the column it ends up in, on SQLite and PostgreSQL alike
# (core.values.limits): message ids are 64-bit, token counts and windows 32-bit.
MESSAGE_ID = {"min": 1, "max": MESSAGE_ID_MAX}
WINDOW = {"min": 1, "max": TOKENS_MAX}
TOKEN_COUNT = {"min": 0, "max": INT32_MAX}
LeafOption = Annotated[
    int | None,
    typer.Option("--leaf", help="Leaf message id of the branch (default: latest).", **MESSAGE_ID),
]
WindowOption = Annotated[int | None, typer.Option(help="Window override (tokens).", **WINDOW)]
MAX_DAYS = 36_500  # a hundred years: any longer retention or idle time is a typo
AsOfOption = Annotated[
    datetime | None,
    typer.Option(
        "--as-of",
        help="As of this ISO 8601 time: only summaries and clearings recorded by then.",
        parser=moments.parse_moment,
    ),
]


def finite(low: float, high: float, *, open_low: bool) -> Callable[[str], float]:
    """A parser for a float option: a finite number in ``low..high`` (``open_low`` excludes
    ``low``). NaN would pass any comparison-based guard, so it is refused here, by type."""

    def parse(text: str) -> float:
        try:
            number = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number") from None
        too_low = number <= low if open_low else number < low
        if not math.isfinite(number) or too_low or number > high:
            bound = ">" if open_low else ">="
            raise typer.BadParameter(f"{text} is not a finite number {bound} {low:g}, <= {high:g}")
        return number

    return parse
