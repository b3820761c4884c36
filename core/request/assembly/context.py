"""Stage 6, context files: those that fit what the tail leaves, each kept or left out whole, with
a note naming the ones left out; no history from before the turn when the turn's own steps did
not all fit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from recap.core.request.assembly.given import Given
from recap.core.request.assembly.parts import ADDED_ROLE, context_message, count
from recap.core.values.draft import Context, Draft
from recap.core.values.request import ContextFile


def stage(given: Given, draft: Draft) -> Draft:
    """The context files that fit the room, and the room left for older history."""
    messages, tokens, forgotten = fit_context(
        given.request.context_files, draft.room, given.encoding
    )
    return replace(
        draft,
        context=Context(messages, forgotten),
        tally=replace(draft.tally, context=tokens),
        room=0 if draft.tail.cut_steps else draft.room - tokens,
    )


def fit_context(
    files: Sequence[ContextFile], room: int, encoding: str
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """The context-file messages that fit, their tokens, and the names of the files left out.

    Files are tried in the given order, each kept or forgotten whole; when any is forgotten, a
    note naming them follows the kept files (if the note itself fits).
    """
    if not files:
        return [], 0, []
    messages = [context_message(f) for f in files]
    costs = [count(ADDED_ROLE, m["content"], encoding) for m in messages]
    if sum(costs) <= room:
        return messages, sum(costs), []
    reserve = count(ADDED_ROLE, _forgotten_note([f.name for f in files]), encoding)
    left = room - reserve
    kept: list[dict[str, Any]] = []
    forgotten: list[str] = []
    for file, message, cost in zip(files, messages, costs, strict=True):
        if cost <= left:
            kept.append(message)
            left -= cost
        else:
            forgotten.append(file.name)
    used = room - reserve - left
    note = _forgotten_note(forgotten)
    note_cost = count(ADDED_ROLE, note, encoding)
    if used + note_cost <= room:
        kept.append({"role": ADDED_ROLE, "content": note})
        used += note_cost
    return kept, used, forgotten


def _forgotten_note(names: Sequence[str]) -> str:
    return (
        "[Context files left out to fit the context window: "
        f"{', '.join(names)}. Read them again if you need them.]"
    )
