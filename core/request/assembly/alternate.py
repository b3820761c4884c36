"""Stage 10, text-only turns: a text-only request merges neighbouring turns of one role
(``core.request.render.alternated``: some chat templates require turns to alternate)."""

from __future__ import annotations

from dataclasses import replace

from recap.core.counting import tokens
from recap.core.request import render
from recap.core.request.assembly.given import Given
from recap.core.values.draft import Draft


def stage(given: Given, draft: Draft) -> Draft:
    """The messages with neighbouring turns of one role merged, and the tokens that changes
    (a merged turn pays its overhead once)."""
    if not given.request.text_only:
        return draft
    messages = draft.messages
    merged = render.alternated(messages)
    if len(merged) == len(messages):
        return draft
    encoding = given.encoding
    delta = tokens.count_messages(merged, encoding) - tokens.count_messages(messages, encoding)
    tally = replace(draft.tally, history=draft.tally.history + delta)
    return replace(draft, messages=merged, tally=tally)
