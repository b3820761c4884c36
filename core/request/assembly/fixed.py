"""Stage 4, the fixed parts: the pinned messages (those a summary covers as a block right after
it, the others in their place but paid for here), the user's memory, the summary, the reminder
and the tools."""

from __future__ import annotations

from dataclasses import replace

from recap.core.counting import tokens
from recap.core.request import pins as pin_rules
from recap.core.request.assembly.given import Given
from recap.core.request.assembly.parts import ADDED_ROLE, count, summary_part, tools_tokens
from recap.core.request.memory import memory_text
from recap.core.values.draft import Draft


def stage(given: Given, draft: Draft) -> Draft:
    """The messages and tokens of the parts fitted before any history."""
    encoding, request, history = given.encoding, given.request, draft.history
    block = draft.ends.block
    if given.pins:
        root = draft.root
        placed = {m.id for m in history.after} | ({root.id} if root is not None else set())
        pinned = pin_rules.summarized(given.stored.pinned, placed)
        block = pin_rules.block(pinned, given.family, text_only=request.text_only)
    model = given.target.model
    pinned_tokens = sum(tokens.count_message(m, encoding, model=model) for m in block)
    pinned_tokens += sum(unit.tokens for unit in history.older if unit.pinned)
    summary_message, summary_tokens = summary_part(
        given.stored.summary, encoding, model, text_only=request.text_only
    )
    memory = memory_text(given.stored.memories)
    reminder = request.reminder
    return replace(
        draft,
        ends=replace(
            draft.ends,
            summary=summary_message,
            memory={"role": ADDED_ROLE, "content": memory} if memory else None,
            reminder={"role": ADDED_ROLE, "content": reminder} if reminder else None,
            block=block,
        ),
        tally=replace(
            draft.tally,
            pinned=pinned_tokens,
            summary=summary_tokens,
            reminder=count(ADDED_ROLE, reminder, encoding) if reminder else 0,
            tools=tools_tokens(request.tools, encoding),
            memory=count(ADDED_ROLE, memory, encoding) if memory else 0,
        ),
    )
