"""The cache-cost replay (pure): cached prefixes, the idle gap, and what each policy clears."""

from __future__ import annotations

from typing import Any

import pytest

from recap.core.decision.cachecost import (
    CACHED_PRICE,
    UNCACHED_PRICE,
    keep_last_every_request,
    middle_step,
    never,
    recap_policy,
    replay,
    to_msgs,
)
from recap.core.decision.policy import Knobs

ENCODING = "o200k_base"


def run(steps: int) -> list[dict[str, Any]]:
    """A user turn, then ``steps`` call/result pairs with large results, then a final answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(steps):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "name": "bash",
             "content": f"output {i}: " + "lorem ipsum dolor " * 200}
        )  # fmt: skip
    messages.append({"role": "assistant", "content": "Fixed."})
    return messages


KNOBS = Knobs(keep_tool_results=3, idle_keep_tool_results=3, protected_tools=())
RECAP = recap_policy(KNOBS, model="gpt-4o-mini", window=10**9)  # never under pressure


@pytest.mark.parametrize(
    ("policy", "gap", "cleared"),
    [(never, None, 0), (never, 4, 0), (RECAP, None, 0), (RECAP, 4, 1), (RECAP, 6, 3)],
)
def test_what_each_policy_clears(policy: Any, gap: int | None, cleared: int) -> None:
    """Never clears nothing; Recap clears only at the gap, keeping the last three results."""
    assert (
        replay(to_msgs(run(8), ENCODING), policy, encoding=ENCODING, gap_at=gap).cleared == cleared
    )


def test_never_clearing_caches_all_but_the_new_messages() -> None:
    """Without clearing or a gap, each request after the first reads its prefix from the cache."""
    branch = to_msgs(run(4), ENCODING)
    result = replay(branch, never, encoding=ENCODING, gap_at=None)
    assert result.requests == 5
    first = branch[0].tokens
    assert result.costs[0] == pytest.approx(first * UNCACHED_PRICE)
    assert result.cached > 0.6 * result.tokens


def test_the_gap_makes_one_request_uncached() -> None:
    """Across the idle gap nothing is cached, so that request costs its full uncached price."""
    branch = to_msgs(run(6), ENCODING)
    gap = middle_step(branch)
    warm = replay(branch, never, encoding=ENCODING, gap_at=None)
    cold = replay(branch, never, encoding=ENCODING, gap_at=gap)
    ends = [i for i, m in enumerate(branch) if m.role == "assistant" and i > 0]
    sent = sum(m.tokens for m in branch[: ends[gap]])
    assert cold.costs[gap] == pytest.approx(sent * UNCACHED_PRICE)
    assert warm.costs[gap] < sent * (UNCACHED_PRICE + CACHED_PRICE) / 2
    others = [i for i in range(len(ends)) if i != gap]
    assert [cold.costs[i] for i in others] == [warm.costs[i] for i in others]


def test_clearing_before_every_request_breaks_the_cache() -> None:
    """Keep-3-every-request sends fewer tokens than never clearing but pays more for them."""
    branch = to_msgs(run(12), ENCODING)
    keep3 = replay(branch, keep_last_every_request(3), encoding=ENCODING, gap_at=None)
    plain = replay(branch, never, encoding=ENCODING, gap_at=None)
    assert keep3.tokens < plain.tokens
    assert keep3.cost > plain.cost


def test_recap_is_never_dearer_than_never_clearing() -> None:
    """Clearing only when the cache is cold costs no more than never clearing, and sends less."""
    branch = to_msgs(run(12), ENCODING)
    gap = middle_step(branch)
    recap = replay(branch, RECAP, encoding=ENCODING, gap_at=gap)
    plain = replay(branch, never, encoding=ENCODING, gap_at=gap)
    assert recap.cost < plain.cost
    assert recap.tokens_after_gap < plain.tokens_after_gap
