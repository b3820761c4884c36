"""The request budget (pure): one answer to "how many tokens may this request carry".

Every consumer plans with the same numbers: ``assemble`` (what it may send), the compression
decision (``core.decision.policy``: the trigger, urgency, pressure clearing), ``stats``, reconcile
and the cache benchmark. In provider tokens::

    usable    = window x (1 - safety_margin) - output reserve
    available = usable - fixed parts

where the fixed parts are what the host sends beside the stored history (its system prompt,
tool schemas, reminder and context files, as ``assemble`` last recorded them in the request
profile, else ``RECAP_DEFAULT_FIXED_TOKENS`` plus a stored root system prompt). Recap's counts
are tiktoken estimates; the calibration factor (provider-reported / estimated, from
``record_usage``) turns them into provider tokens, so a budget in estimated tokens is
``usable / factor``.

The output reserve. litellm's bundled model map gives ``max_input_tokens`` and
``max_output_tokens`` and no total. For nearly every chat model the published input limit is the
whole context window, and the reply is counted against it too (OpenAI's gpt-4o and gpt-4.1,
Anthropic, DeepSeek, Mistral, a local server's context length). So a window taken from the map is
treated as shared: ``min(RECAP_RESERVE_OUTPUT_TOKENS, max_output_tokens)`` stays free. A window the
host gives itself (``max_input_tokens``, on the conversation or the call) is, as its name says, an
input limit, and reserves nothing. A conversation's own override (``Recap.set_output_reserve``)
wins over both; 0 turns the reserve off (for example for a model with a separate input limit,
such as OpenAI's gpt-5 family, which the map cannot tell apart).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from recap.core.counting.calibration import KindFactors
from recap.core.counting.tokens import CALIBRATION_MAX, CALIBRATION_MIN
from recap.core.values.profile import Reading

# A reading older than this starts to lose weight; at the stale age it is ignored.
CALIBRATION_FRESH = timedelta(hours=24)
CALIBRATION_STALE = timedelta(days=7)
# A reading this many messages behind the leaf starts to lose weight; at the far distance it is
# ignored (ids grow with every message, so their difference is how far the branch moved on).
CALIBRATION_NEAR_MESSAGES = 200
CALIBRATION_FAR_MESSAGES = 2_000
# A factor per kind of content this close to the single one is the single one (one reading
# gives every kind its ratio, up to rounding).
SAME_FACTOR = 1e-7


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """The numbers one request is planned with; ``fixed`` is in estimated tokens."""

    window: int
    safety_margin: float
    output_reserve: int
    fixed: int = 0
    calibration: float = 1.0

    @property
    def usable(self) -> int:
        """Provider tokens a whole request may take: the window less margin and reserve."""
        return int(self.window * (1 - self.safety_margin)) - self.output_reserve

    @property
    def request(self) -> int:
        """Estimated tokens a whole request may take (fixed parts included)."""
        return math.floor(self.usable / self.calibration)

    @property
    def available(self) -> int:
        """Provider tokens left for history: ``window x (1 - margin) - fixed - reserve``."""
        return self.usable - math.ceil(self.fixed * self.calibration)

    def history(self, history_estimate: int) -> int:
        """Provider tokens of a stored history estimated at ``history_estimate``."""
        return math.ceil(history_estimate * self.calibration)

    def pressure(self, history_estimate: int) -> float:
        """How full the history's room is: history / available (1.0 just fits)."""
        available = self.available
        return self.history(history_estimate) / available if available > 0 else math.inf


def request_budget(
    window: int,
    *,
    safety_margin: float,
    output_reserve: int = 0,
    fixed: int = 0,
    calibration: float = 1.0,
) -> Budget:
    """The one budget every consumer plans with (see the module docstring)."""
    if window <= 0:
        raise ValueError(f"the window must be positive, got {window}")
    factor = min(max(calibration, CALIBRATION_MIN), CALIBRATION_MAX)
    return Budget(
        window=window,
        safety_margin=safety_margin,
        output_reserve=max(output_reserve, 0),
        fixed=max(fixed, 0),
        calibration=factor,
    )


def output_reserve(
    model_entry: Mapping[str, Any] | None,
    *,
    window_given: bool,
    setting: int,
    override: int | None = None,
) -> int:
    """Tokens kept free for the reply: the conversation's override; else nothing for a window
    the host gave (an input limit); else ``setting``, or the model's max output when smaller."""
    if override is not None:
        return max(override, 0)
    if window_given or model_entry is None:
        return 0
    most = model_entry.get("max_output_tokens")
    return min(setting, int(most)) if isinstance(most, int | float) and most > 0 else setting


def calibration_factor(
    reading: Reading | None,
    *,
    leaf_id: int | None,
    now: datetime,
    composition: Sequence[float] | None = None,
) -> float:
    """measured / estimated, clamped, and drawn back to 1 as the reading gets stale (older than
    a day, ignored after a week) or the branch moves far past it (ignored 2,000 messages on).

    With the ``composition`` of the request to plan (its estimate split by kind of content,
    ``core.counting.kinds``) and rates per kind fitted over the recent readings, the factor is
    that request's own (its tokens of each kind at their rate, with the residual quantile,
    ``core.counting.calibration``) where it is higher than the latest reading's single factor,
    which stands otherwise."""
    if reading is None or reading.estimated <= 0 or reading.measured <= 0:
        return 1.0
    raw = min(max(reading.measured / reading.estimated, CALIBRATION_MIN), CALIBRATION_MAX)
    fitted = kind_factors(reading)
    if fitted is not None and composition is not None and sum(composition) > 0:
        by_kind = fitted.factor(tuple(composition))
        # a request richer in a costly kind than the latest reading plans above its factor; one
        # poorer never below it: the latest reading (a provider's refusal states one) may be
        # more than the fit over older readings explains
        if by_kind - raw > SAME_FACTOR * raw:  # else the readings said no more than one
            raw = by_kind
    weight = _age_weight(reading.at, now) * _distance_weight(reading.leaf_id, leaf_id)
    return 1.0 + (raw - 1.0) * weight


def kind_factors(reading: Reading | None) -> KindFactors | None:
    """The reading's rates per kind of content, when they were fitted."""
    if reading is None or reading.kinds is None:
        return None
    return KindFactors.from_values(reading.kinds)


def _age_weight(at: datetime | None, now: datetime) -> float:
    if at is None:
        return 1.0
    age = now - at
    return _linear(age.total_seconds(), CALIBRATION_FRESH.total_seconds(), CALIBRATION_STALE)


def _distance_weight(read_at: int | None, leaf: int | None) -> float:
    if read_at is None or leaf is None:
        return 1.0
    moved = abs(leaf - read_at)
    if moved <= CALIBRATION_NEAR_MESSAGES:
        return 1.0
    span = CALIBRATION_FAR_MESSAGES - CALIBRATION_NEAR_MESSAGES
    return max(0.0, 1.0 - (moved - CALIBRATION_NEAR_MESSAGES) / span)


def _linear(value: float, full_until: float, stale: timedelta) -> float:
    if value <= full_until:
        return 1.0
    span = stale.total_seconds() - full_until
    return max(0.0, 1.0 - (value - full_until) / span)
