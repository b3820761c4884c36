"""Stage 3, reasoning dropped: the thinking this request does not send taken out of the units'
stored counts (a stored count holds what the message sends while its turn is in progress:
``tokens.count_reasoning``); the older messages whose thinking is left out, with its tokens
(``reasoning_dropped``, to record)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from recap.core.counting import reasoning, tokens
from recap.core.request.assembly.given import Given, thinking_from
from recap.core.request.assembly.parts import REASONING_CLEARING
from recap.core.values.draft import Draft, Unit
from recap.core.values.records import ClearingRec, Msg


def stage(given: Given, draft: Draft) -> Draft:
    """The older units and the tail counted without the reasoning they do not send."""
    history = draft.history
    records: list[tuple[int, int]] = []
    counted: list[Sequence[Unit]] = []
    recent = thinking_from(given, history.older)
    for in_progress, units in ((False, history.older), (True, history.tail)):
        dropped = _dropped(units, draft.cleared, given, in_progress=in_progress)
        if not in_progress and recent < len(units):  # older turns within the window
            again = _dropped(units[recent:], draft.cleared, given, in_progress=True)
            dropped = [d for d in dropped if d[0] < recent]
            dropped += [(recent + position, tokens, False) for position, tokens, _ in again]
        if dropped:
            changed = list(units)
            for position, tokens_dropped, record in dropped:
                unit = changed[position]
                changed[position] = unit._replace(tokens=unit.tokens - tokens_dropped)
                if record:
                    records.append((unit.ids[0], tokens_dropped))
            units = changed
        counted.append(units)
    if counted[0] is history.older and counted[1] is history.tail:
        return draft
    older, tail = counted
    return replace(
        draft,
        history=replace(history, older=older, tail=tail),
        reasoning_dropped=tuple(records),
    )


def _dropped(
    units: Sequence[Unit],
    clearings: Mapping[int, ClearingRec],
    given: Given,
    *,
    in_progress: bool,
) -> list[tuple[int, int, bool]]:
    """For each assistant unit whose stored count holds reasoning this request does not send:
    its position, those tokens, and whether to record them (an older message's thinking left
    out, with no reasoning row yet)."""
    model, family, text_only = given.target.model, given.family, given.request.text_only
    found: list[tuple[int, int, bool]] = []
    for position, unit in enumerate(units):
        item = unit.items[0]
        if not isinstance(item, Msg) or item.role != "assistant":
            continue
        if not (item.extra or item.content_parts):
            continue
        clearing = clearings.get(item.id)
        dropped = _reasoning_dropped(
            item, clearing, family, model=model, in_progress=in_progress, text_only=text_only
        )
        if not dropped:
            continue
        fresh = clearing is None or clearing.arguments_only  # no reasoning row yet
        found.append((position, dropped, fresh and not in_progress and not text_only))
    return found


def _reasoning_dropped(
    message: Msg,
    clearing: ClearingRec | None,
    family: str,
    *,
    model: str,
    in_progress: bool,
    text_only: bool,
) -> int:
    """Tokens of the message's stored count that hold reasoning this request does not send."""
    if clearing is not None and clearing.reason == REASONING_CLEARING and not text_only:
        return 0 if in_progress else clearing.tokens_reclaimed - clearing.arguments_tokens
    raw = message.to_openai()
    if not reasoning.carries(raw):
        return 0
    encoding = tokens.encoding_name_for(model)
    sent = reasoning.as_sent(raw, family, in_progress=in_progress, text_only=text_only, model=model)
    stored = tokens.count_reasoning(raw, encoding, model=model)
    return max(stored - tokens.count_reasoning(sent, encoding), 0)
