"""Benchmarks: ``python -m bench`` runs each module in ``BENCHES``, prints one JSON object of
named figures and rewrites ``bench/RESULTS.md``.

Every figure is a ratio against a baseline measured in the same run (or a plain count), so the
numbers mean the same on a slow machine and a fast one. Each module exposes
``run(data: list[Path]) -> list[Figure]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Module names under bench/, run in this order.
BENCHES: tuple[str, ...] = (
    "tokens",
    "sweep",
    "cache",
    "cachemarks",
    "assemble",
    "add",
    "skips",
    "compress",
    "load",
    "media",
    "serve",
    "serve_turns",
    "metrics",
    "tracing",
    "reuse",
    "serve_hostile",
    "large",
    "fidelity",
    "fuzz",
    "scale",
    "ui",
    "frameworks",
    "lifecycle",
    "summaries",
    "race",
    "native",
    "attach",
    "economics",
    "memory",
    "doors",
    "suite_slow",
)


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


def best_of_each(funcs: Sequence[Callable[[], Any]], repeats: int) -> list[float]:
    """The least CPU time of ``repeats`` calls of each function, taken in turn: CPU time of this
    process (SQLite's reads included) rather than wall time, and in turn, so that other work on
    the machine skews neither side of a ratio."""
    best = [float("inf")] * len(funcs)
    for _ in range(repeats):
        for index, func in enumerate(funcs):
            started = time.process_time()
            func()
            best[index] = min(best[index], time.process_time() - started)
    return best
