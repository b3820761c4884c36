"""Branches of the message tree and the summary that applies to one (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from recap.core.values.records import ClearingRec, Msg, SummaryRec


class UnknownMessageError(LookupError):
    """A message id that is not in the conversation."""


def branch_ids(parents: Mapping[int, int | None], leaf: int) -> list[int]:
    """The ids from the root to ``leaf`` (inclusive), following ``parent_id`` links."""
    if leaf not in parents:
        raise UnknownMessageError(f"message {leaf} is not in this conversation")
    path: list[int] = []
    seen: set[int] = set()
    node: int | None = leaf
    while node is not None:
        if node in seen:
            raise ValueError(f"message {node} is its own ancestor")
        seen.add(node)
        path.append(node)
        node = parents.get(node)
    path.reverse()
    return path


def applicable_summary(
    summaries: Iterable[SummaryRec], branch: Sequence[int] | set[int]
) -> SummaryRec | None:
    """The summary whose cutoff lies on the branch, the highest cutoff winning (or None).

    A summary covers the root-to-cutoff path, which every branch through the cutoff shares; an
    edit or regenerate after the cutoff keeps it, an edit before the cutoff leaves it out.
    """
    on_branch = branch if isinstance(branch, set) else set(branch)
    best: SummaryRec | None = None
    for summary in summaries:
        if summary.cutoff_message_id in on_branch and (
            best is None or summary.cutoff_message_id > best.cutoff_message_id
        ):
            best = summary
    return best


def messages_after_cutoff(branch: Sequence[Msg], summary: SummaryRec | None) -> list[Msg]:
    """The part of a branch a summary does not cover (the whole branch without one)."""
    if summary is None:
        return list(branch)
    for index, message in enumerate(branch):
        if message.id == summary.cutoff_message_id:
            return list(branch[index + 1 :])
    return list(branch)


def effective_history_tokens(
    branch: Sequence[Msg], summary: SummaryRec | None, clearings: Mapping[int, ClearingRec]
) -> int:
    """Stored tokens of what the branch sends now: the summary, then messages after its cutoff,
    cleared tool results counted at their placeholder size."""
    total = summary.tokens if summary is not None else 0
    for message in messages_after_cutoff(branch, summary):
        cleared = clearings.get(message.id)
        total += message.tokens - (cleared.tokens_reclaimed if cleared is not None else 0)
    return total
