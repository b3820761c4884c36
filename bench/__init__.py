"""Benchmarks: ``python -m bench`` runs each module in ``BENCHES``, prints one JSON object of
named figures and rewrites ``bench/RESULTS.md``.

Every figure is a ratio against a baseline measured in the same run (or a plain count), so the
numbers mean the same on a slow machine and a fast one. Each module exposes
``run(data: list[Path]) -> list[Figure]``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Module names under bench/, run in this order.
BENCHES: tuple[str, ...] = ("tokens", "sweep", "cache", "assemble", "compress")


@dataclass(frozen=True)
class Figure:
    """One named result: its value, the bound it must meet (if any), and how it was measured."""

    name: str
    value: float
    bound: str  # "<= 1.3", ">= 20", "== 0" or "" for a figure that is only reported
    description: str

    def meets(self) -> bool:
        """Whether the value holds its bound (always true for a reported-only figure)."""
        if not self.bound:
            return True
        op, limit = self.bound.split()
        checks = {
            "<=": self.value <= float(limit),
            ">=": self.value >= float(limit),
            "==": self.value == float(limit),
        }
        return checks[op]
