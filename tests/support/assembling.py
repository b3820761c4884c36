"""The table tests' shorthand for ``core.request.assembly.assemble``: every knob a keyword.

``assemble`` takes three values (what is stored, what the host asks for, the model and its
limits); the tables list plain keywords per case, so this builds the three values from them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from recap.core.counting import media
from recap.core.request import assembly
from recap.core.values.records import ClearingRec, Msg, SummaryRec
from recap.core.values.request import ContextFile, RequestSpec


def assemble(
    branch: Sequence[Msg],
    *,
    model: str,
    window: int,
    safety_margin: float,
    summary: SummaryRec | None = None,
    clearings: Mapping[int, ClearingRec] | None = None,
    system: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    reminder: str | None = None,
    context_files: Sequence[ContextFile] = (),
    text_only: bool = False,
    cache_breakpoints: bool | None = None,
    missing_outputs: Collection[str] = frozenset(),
    omitted: Sequence[int] = (),
    budget: int | None = None,
    media_policy: media.MediaPolicy | None = None,
    pinned: Sequence[Msg] = (),
    thinking_turns: int = 1,
) -> assembly.AssembledRequest:
    """``assembly.assemble`` with its three values built from keywords."""
    target = assembly.Target(
        model=model,
        window=window,
        safety_margin=safety_margin,
        budget=budget,
        media_policy=media_policy,
        thinking_turns=thinking_turns,
    )
    stored = assembly.StoredBranch(
        branch=branch,
        summary=summary,
        clearings=clearings,
        pinned=pinned,
        omitted=omitted,
        missing_outputs=missing_outputs,
    )
    request = RequestSpec(
        system=system,
        tools=tools,
        reminder=reminder,
        context_files=context_files,
        text_only=text_only,
        cache_breakpoints=cache_breakpoints,
    )
    return assembly.assemble(stored, request, target=target)
