"""Seeded runs split in two: a fast subset in the default ``pytest`` run, the rest marked
``slow`` (``pytest -m slow``, which ``python -m bench suite_slow`` runs; docs/testing.md).

Together the two runs cover exactly the cases the test names: nothing is dropped, only moved.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

SLOW = pytest.mark.slow


def seeds(values: Iterable[Any], fast: int) -> list[Any]:
    """The values as parameters: the first ``fast`` run by default, the others only under
    ``-m slow`` (their ids unchanged)."""
    listed = list(values)
    return [*listed[:fast], *(pytest.param(v, marks=SLOW) for v in listed[fast:])]


def sizes(fast: int, full: int) -> list[Any]:
    """A case count as a parameter: ``fast`` cases by default (id ``fast``), ``full`` under
    ``-m slow`` (id ``full``)."""
    return [pytest.param(fast, id="fast"), pytest.param(full, marks=SLOW, id="full")]
