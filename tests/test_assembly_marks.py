"""Cache marks in a text-only request: the summary and the pinned messages it covers merge with
their neighbours of one role into fewer turns (``core.request.render.alternated``), so the stable
prefix's mark goes on the turn that holds its end, counted in merged turns. It was placed by the
positions before the merge, past the end of a short request (an ``IndexError``) or on a later
turn of a long one."""

from __future__ import annotations

import random
from typing import Any

import pytest

from recap.core.counting import tokens
from recap.core.errors import BudgetError
from recap.core.request.assembly.cache_marks import MAX_CACHE_MARKS
from tests.support.assembling import assemble
from tests.test_assembly import ENCODING, MODEL, chain, summary_at
from tests.test_assembly_random import random_case

BIG = 100_000


def marked(messages: list[dict[str, Any]]) -> list[int]:
    """The positions of the messages that carry a cache mark."""
    return [i for i, m in enumerate(messages) if "cache_control" in str(m.get("content"))]


@pytest.mark.parametrize(
    ("specs", "cutoff", "pins", "expected"),
    [
        # system, then one user turn: the summary, both pinned messages and the last user turn
        (["S:stored", "U:u1", "U:u2", "A:a1", "U:u3"], 4, (2, 3), [0, 1]),
        # a pinned assistant answer splits the merged turns: summary+u1, a1, u2+...
        (["S:stored", "U:u1", "A:a1", "U:u2", "A:a2", "U:u3"], 5, (2, 3), [0, 2, 3]),
    ],
)
def test_text_only_marks_the_turn_that_ends_the_stable_prefix(
    specs: list[str], cutoff: int, pins: tuple[int, ...], expected: list[int]
) -> None:
    """The mark after the summary and its pinned block is on the merged turn holding the last
    pinned message, and every mark is on a message of the request."""
    branch = chain(*specs)
    request = assemble(
        branch,
        model=MODEL,
        window=BIG,
        safety_margin=0.0,
        summary=summary_at(cutoff),
        pinned=[branch[i - 1] for i in pins],
        text_only=True,
        cache_breakpoints=True,
    )
    assert marked(request.messages) == expected
    last_pinned = specs[pins[-1] - 1].split(":", 1)[1]
    stable_end = request.messages[expected[1]]
    assert last_pinned in tokens.content_text(stable_end["content"])
    assert request.tokens.total == tokens.count_messages(request.messages, ENCODING)


@pytest.mark.parametrize("block", range(4))
def test_random_text_only_requests_with_pins_and_marks(block: int) -> None:
    """Seeded branches with a summary, pinned messages anywhere, text only and cache marks: the
    request is built (or refused with a ``BudgetError``), with at most four marks, the system
    prompt marked, and its total equal to a recount."""
    rng = random.Random(block)
    for seed in range(block * 100, block * 100 + 100):
        case = random_case(seed)
        branch = case.pop("branch")
        pinned = [m for m in branch if rng.random() < 0.2]
        try:
            request = assemble(
                branch, model=MODEL, pinned=pinned, text_only=True, cache_breakpoints=True, **case
            )
        except BudgetError:
            continue
        positions = marked(request.messages)
        assert len(positions) <= MAX_CACHE_MARKS, seed
        if request.messages[0]["role"] == "system":
            assert positions[:1] == [0], seed
        assert request.tokens.total == tokens.count_messages(request.messages, ENCODING), seed
