"""The next request's token bar (pure): ``recap stats`` split into the parts of the window.

The figures are the ones ``core.service.conversation_stats`` (``recap stats``) reports: the
window, ``used`` (the whole next request in provider tokens), the output reserve, the trigger and
the room left for history (``available``). The parts of ``used`` are the stored estimates of what
makes it up (the host's system prompt and other fixed parts, its tools, the summary, the history,
and within the history the media and the reasoning the request sends), scaled to provider tokens
by largest remainders so that they add up to ``used`` exactly: the bar matches ``recap stats`` to
the token. The rest of the window is the output reserve, the safety margin, and what is free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from recap.core.results import Stats
from recap.core.values.profile import FixedParts

# The parts of a request, in the bar's order; then what the window keeps beside the request.
PARTS = ("system", "tools", "summary", "history", "media", "reasoning")
SPARE = ("reserve", "margin", "free")


@dataclass(frozen=True, slots=True)
class Segment:
    name: str
    tokens: int  # provider tokens, as the bar draws them
    estimated: int | None = None  # Recap's own count, before calibration (parts only)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One stacked bar over the window, with its trigger and urgent lines."""

    window: int
    used: int
    segments: tuple[Segment, ...]
    trigger_at: int  # tokens from the left where the history reaches the trigger
    urgent_at: int  # ... and where it makes a run urgent
    over: int  # tokens past what the window can take (0 when it fits)
    stats: Stats

    def tokens(self, name: str) -> int:
        return next(s.tokens for s in self.segments if s.name == name)


def apportion(parts: Sequence[int], total: int) -> list[int]:
    """``parts`` scaled to add up to ``total`` exactly (largest remainders; ties to the first)."""
    whole = sum(parts)
    if whole <= 0:
        return [total if index == 0 else 0 for index in range(len(parts))]
    shares = [part * total / whole for part in parts]
    floors = [math.floor(share) for share in shares]
    left = total - sum(floors)
    order = sorted(range(len(parts)), key=lambda i: (floors[i] - shares[i], i))
    for index in order[:left]:
        floors[index] += 1
    return floors


def token_bar(
    stats: Stats,
    *,
    parts: FixedParts | None,
    summary_tokens: int,
    media_tokens: int,
    reasoning_tokens: int,
    safety_margin: float,
    urgent_ratio: float,
) -> Bar:
    """The bar of one conversation's next request (see the module docstring). ``parts`` is the
    request profile's record of what the host last sent, ``media_tokens`` and
    ``reasoning_tokens`` what the assembled request sends of each."""
    tools = min(parts.tools, stats.fixed) if parts is not None else 0
    history = max(stats.estimated - stats.fixed - summary_tokens, 0)
    media = min(max(media_tokens, 0), history)
    reasoning = min(max(reasoning_tokens, 0), history - media)
    estimates = [
        stats.fixed - tools,
        tools,
        min(summary_tokens, stats.estimated - stats.fixed),
        history - media - reasoning,
        media,
        reasoning,
    ]
    scaled = apportion(estimates, stats.used)
    margin = stats.window - int(stats.window * (1 - safety_margin))
    free = stats.window - stats.used - stats.output_reserve - margin
    segments = [
        Segment(name, tokens, estimated)
        for name, tokens, estimated in zip(PARTS, scaled, estimates, strict=True)
    ]
    segments += [
        Segment("reserve", stats.output_reserve),
        Segment("margin", margin),
        Segment("free", max(free, 0)),
    ]
    usable = int(stats.window * (1 - safety_margin)) - stats.output_reserve
    fixed_provider = usable - stats.available  # the fixed parts, calibrated, as the budget has them
    return Bar(
        window=stats.window,
        used=stats.used,
        segments=tuple(segments),
        trigger_at=fixed_provider + stats.trigger,
        urgent_at=fixed_provider + int(urgent_ratio * max(stats.available, 0)),
        over=max(-free, 0),
        stats=stats,
    )
