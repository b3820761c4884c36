"""A clearing plan: the steps a decision records beside a branch's tool results (values only).

``core.decision.toolresults.plan_clearings`` makes one; ``core.storage`` writes its rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from recap.core.values.records import AGED, ARGUMENTS, CLEARED


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedClearing:
    """One step to record for a message: its stage, what the message's state after it saves
    against the stored count (the row's ``tokens_reclaimed``), and what the step itself saves
    (``gain``: less than that when the result was aged before; None: the same)."""

    message_id: int
    tokens_reclaimed: int
    stage: str = CLEARED
    gain: int | None = None
    kept_chars: int | None = None  # an aged result's character cap

    @property
    def saves(self) -> int:
        """Tokens the request sends fewer once this step is recorded."""
        return self.tokens_reclaimed if self.gain is None else self.gain


@dataclass(frozen=True, slots=True)
class ClearingPlan:
    """The steps to record in one conversation, in branch order; falsy when there are none."""

    reason: str
    items: tuple[PlannedClearing, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[PlannedClearing]:
        return iter(self.items)

    @property
    def message_ids(self) -> list[int]:
        return [item.message_id for item in self.items]

    @property
    def tokens_reclaimed(self) -> int:
        """What the plan saves, step by step (an aged result cleared saves the difference)."""
        return sum(item.saves for item in self.items)

    def count(self, stage: str) -> int:
        """Steps of one stage."""
        return sum(1 for item in self.items if item.stage == stage)

    def describe(self) -> str:
        """The plan in words, as a run's reason says it."""
        return describe_steps(
            self.count(CLEARED), self.count(AGED), self.count(ARGUMENTS), self.tokens_reclaimed
        )


def describe_steps(cleared: int, aged: int, arguments: int, tokens_reclaimed: int) -> str:
    """ "cleared 3 and aged 5 old tool results, shortened the arguments of 2 old calls (900
    tokens)": what a clearing did, every stage counted apart."""
    results = []
    if cleared:
        results.append(f"cleared {cleared}")
    if aged:
        results.append(f"aged {aged}")
    parts = [" and ".join(results) + " old tool results"] if results else []
    if arguments:
        parts.append(f"shortened the arguments of {arguments} old tool calls")
    return f"{', '.join(parts) or 'cleared 0 old tool results'} ({tokens_reclaimed} tokens)"
