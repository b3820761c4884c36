"""Stage 9, reasoning sent: the reasoning and thinking content the request sends, counted apart
from the history (``tally.reasoning``)."""

from __future__ import annotations

from dataclasses import replace

from recap.core.counting import tokens
from recap.core.request.assembly.given import Given
from recap.core.values.draft import Draft


def stage(given: Given, draft: Draft) -> Draft:
    """The reasoning sent moved from the history's count to its own."""
    sent = sum(tokens.count_reasoning(m, given.encoding) for m in draft.messages)
    if not sent:
        return draft
    tally = draft.tally
    return replace(draft, tally=replace(tally, reasoning=sent, history=tally.history - sent))
