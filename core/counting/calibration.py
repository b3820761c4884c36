"""Calibration by kind of content (pure): one factor per kind, learned from the provider's
readings, and the factor a request is planned with.

A reading is a request's composition (``core.counting.kinds``: Recap's estimate split into prose,
code and JSON, digit runs, and dense strings) and the prompt tokens the provider reported for it.
The provider's count is close to a sum of a rate per kind times the tokens of that kind, so over
the last ``WINDOW`` readings the rates are fitted by least squares of the relative error, each
rate within ``[CALIBRATION_MIN, CALIBRATION_MAX]``, with a light pull (``RIDGE``) towards the
readings' pooled ratio (sum measured / sum estimated): readings of one conversation differ little
in their mix, and what they do not tell apart stays at the pooled ratio instead of drifting.

Planning is conservative where the readings are:

- a kind the readings hardly held (less than ``SEEN`` of a request's worth in all) is planned at
  the highest rate of the kinds they did hold, or the pooled ratio if higher: until it is known, a
  kind counts at the worst rate seen; digit runs and dense strings never seen (``NEVER``) at
  least at ``CALIBRATION_MAX`` (``UNSEEN``), as a provider may count them at twice tiktoken's
  count whatever the prose and code it was seen with;
- a rate is known only as far as the readings went: each kind's ``reach`` is the largest share
  of a request it held in them, and a request holding more of a kind plans the tokens past that
  share at the kind's cautious rate (``beyond``: the worst rate of the kinds seen, or the pooled
  ratio if higher, and for digit runs and dense strings at least ``UNSEEN``). Readings that
  carry the same few tokens of a kind (one attachment, sent again with every request) hardly
  tell its rate from the others', and a fit that explains them to half a percent can still put
  it at 1.5 where the provider counts 2.0: a later request holding ten times as much of it is
  then planned 10 % short;
- the fitted rates explain each reading up to a residual; a request is planned with the rates
  times ``upper``, the 90th percentile of measured / predicted over the readings (the largest of
  them below ten readings), never below 1 and at most ``UPPER_MAX``: the p90 error, not the
  median, is what has to stay inside the safety margin.

A request is planned with ``factor(composition)``: its predicted provider tokens over its estimate.
Without readings of known composition the single factor of the latest reading stands
(``core.counting.budget.calibration_factor``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from recap.core.counting.kinds import KINDS, Composition
from recap.core.counting.tokens import CALIBRATION_MAX, CALIBRATION_MIN

WINDOW = 16  # the readings a fit uses, newest first
RIDGE = 0.005  # the pull of each rate towards the pooled ratio
SEEN = 0.2  # a kind's tokens over the readings, in requests' worth, before its rate is trusted
# The least rate an unseen kind is planned with: digit runs and dense strings count up to twice
# tiktoken's count at some providers, more than any mix of prose and code tells.
UNSEEN = (0.0, 0.0, CALIBRATION_MAX, CALIBRATION_MAX)
NEVER = 0.02  # a kind held less than this (in requests' worth) was never really seen
UPPER_QUANTILE = 0.9
UPPER_MAX = 1.15
SWEEPS = 200  # coordinate descent sweeps (four unknowns: converged long before)


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading: the estimated tokens per kind of the request measured, and the provider's
    prompt tokens for it."""

    composition: Composition
    measured: int


@dataclass(frozen=True, slots=True)
class KindFactors:
    """The fitted rates per kind (planning rates: unseen kinds already raised) and ``upper``,
    the residual quantile every plan is multiplied by."""

    rates: tuple[float, ...]
    upper: float = 1.0
    # the largest share of a request each kind held in the readings (1: the rate holds for a
    # request of that kind alone), and the rate past it (0: the kind's own rate)
    reach: tuple[float, ...] = (1.0,) * len(KINDS)
    worst: float = 0.0

    def predicted(self, composition: Composition) -> float:
        """The provider tokens the rates predict for a request of this composition (the fit
        alone: what it says of the readings' own kind of request)."""
        return sum(x * rate for x, rate in zip(composition, self.rates, strict=True))

    def beyond(self, kind: int) -> float:
        """The rate of a kind's tokens past its reach: the worst rate seen, at least the kind's
        own, and for digit runs and dense strings at least ``UNSEEN``."""
        return max(self.rates[kind], self.worst, UNSEEN[kind])

    def planned(self, composition: Composition) -> float:
        """The provider tokens to plan a request of this composition with, before ``upper``:
        each kind at its rate up to its reach, past it at ``beyond``."""
        total = sum(composition)
        out = 0.0
        for kind, (tokens, rate, reach) in enumerate(
            zip(composition, self.rates, self.reach, strict=True)
        ):
            within = min(tokens, reach * total)
            out += within * rate + (tokens - within) * self.beyond(kind)
        return out

    def factor(self, composition: Composition) -> float:
        """Provider tokens per estimated token to plan a request of this composition with
        (``upper`` included), clamped; with an empty composition the highest rate."""
        total = sum(composition)
        mean = self.planned(composition) / total if total > 0 else max(self.rates)
        return min(max(mean * self.upper, CALIBRATION_MIN), CALIBRATION_MAX)

    def values(self) -> tuple[float, ...]:
        """The rates, ``upper``, the reach per kind and ``worst``, in one tuple (as a
        ``Reading`` carries them)."""
        return (*self.rates, self.upper, *self.reach, self.worst)

    @classmethod
    def from_values(cls, values: Sequence[float]) -> KindFactors | None:
        """From ``values()``, or from the rates and ``upper`` alone (as stored before the
        reach was: no reach limit); None for any other length."""
        n = len(KINDS)
        if len(values) == n + 1:
            return cls(tuple(values[:n]), values[n])
        if len(values) == 2 * n + 2:
            return cls(tuple(values[:n]), values[n], tuple(values[n + 1 : -1]), values[-1])
        return None

    def encode(self) -> str:
        """As stored: the rates, ``upper``, the reach per kind (three decimals) and ``worst``
        (within the column's 96 characters)."""
        rates = " ".join(f"{value:.9g}" for value in (*self.rates, self.upper))
        reach = " ".join(f"{value:.3f}" for value in self.reach)
        return f"{rates} {reach} {self.worst:.6g}"

    @classmethod
    def decode(cls, text: str | None) -> KindFactors | None:
        """Read back (None for nothing stored or anything malformed)."""
        if not text:
            return None
        try:
            values = [float(part) for part in text.split()]
        except ValueError:
            return None
        n = len(KINDS)
        if not all(math.isfinite(v) and v >= 0 for v in values) or not all(
            v > 0 for v in values[: n + 1]
        ):
            return None
        return cls.from_values(values)


def pooled(samples: Sequence[Sample]) -> float:
    """Sum measured over sum estimated, clamped (1.0 without readings)."""
    estimated = sum(sum(s.composition) for s in samples)
    measured = sum(s.measured for s in samples)
    if estimated <= 0 or measured <= 0:
        return 1.0
    return min(max(measured / estimated, CALIBRATION_MIN), CALIBRATION_MAX)


def priors(pooled_ratio: float) -> tuple[float, ...]:
    """What each rate is pulled towards: the pooled ratio, and for digit runs and dense strings
    at least ``UNSEEN`` (a provider may count them at twice tiktoken's count: what the readings
    do not pin down of them stays there, not at the readings' average)."""
    return tuple(max(pooled_ratio, floor) for floor in UNSEEN)


def normal_equations(
    samples: Sequence[Sample], prior: float | Sequence[float], ridge: float
) -> tuple[list[list[float]], list[float]]:
    """The quadratic the fit minimizes, ``f A f - 2 b f`` (plus a constant): the readings'
    relative errors squared, and ``ridge`` times each rate's distance to its ``prior`` (one for
    every kind, or one per kind) squared."""
    n = len(KINDS)
    towards = [float(prior)] * n if isinstance(prior, int | float) else list(prior)
    a = [[ridge if i == j else 0.0 for j in range(n)] for i in range(n)]
    b = [ridge * towards[i] for i in range(n)]
    for sample in samples:
        if sample.measured <= 0:
            continue
        shares = [x / sample.measured for x in sample.composition]
        for i in range(n):
            b[i] += shares[i]
            for j in range(n):
                a[i][j] += shares[i] * shares[j]
    return a, b


def objective(a: list[list[float]], b: list[float], rates: Sequence[float]) -> float:
    """``f A f - 2 b f`` at ``rates``."""
    n = len(rates)
    quad = sum(rates[i] * a[i][j] * rates[j] for i in range(n) for j in range(n))
    return quad - 2 * sum(b[i] * rates[i] for i in range(n))


def solve(a: list[list[float]], b: list[float], low: float, high: float) -> list[float]:
    """The minimum of ``f A f - 2 b f`` with every rate within ``[low, high]`` (``A`` is positive
    definite with the ridge: one minimum). Coordinate descent, exact per coordinate, finds which
    rates sit at a bound; the others are then solved exactly together (coordinate descent alone
    crawls along the directions the readings hardly tell apart), and the point kept is the
    better one within the box."""
    n = len(b)
    rates = [min(max(b[i] / a[i][i], low), high) for i in range(n)]
    for _ in range(SWEEPS):
        moved = 0.0
        for i in range(n):
            rest = sum(a[i][j] * rates[j] for j in range(n) if j != i)
            value = min(max((b[i] - rest) / a[i][i], low), high)
            moved = max(moved, abs(value - rates[i]))
            rates[i] = value
        if moved < 1e-12:
            break
    for _ in range(n):
        free = [i for i in range(n) if low < rates[i] < high]
        exact = _solve_free(a, b, rates, free)
        if exact is None or any(not low <= r <= high for r in exact):
            break
        if objective(a, b, exact) > objective(a, b, rates):
            break
        rates = exact
        grad = [sum(a[i][j] * rates[j] for j in range(n)) - b[i] for i in range(n)]
        freed = [i for i in range(n) if i not in free and _pulled_inside(rates[i], grad[i], low)]
        if not freed:
            break
        for i in freed:  # a rate at a bound the gradient pulls inside: free it and solve again
            rates[i] = min(max(rates[i] - 1e-9 if rates[i] >= high else rates[i] + 1e-9, low), high)
    return rates


def _pulled_inside(rate: float, grad: float, low: float) -> bool:
    return grad > 0 if rate > low else grad < 0


def _solve_free(
    a: list[list[float]], b: list[float], rates: list[float], free: list[int]
) -> list[float] | None:
    """``rates`` with the ``free`` ones solved exactly, the others held (Gaussian elimination;
    None for a singular system)."""
    held = [j for j in range(len(b)) if j not in free]
    rows = [[a[i][j] for j in free] + [b[i] - sum(a[i][j] * rates[j] for j in held)] for i in free]
    size = len(free)
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-15:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(size):
            if r != col:
                ratio = rows[r][col] / rows[col][col]
                rows[r] = [x - ratio * y for x, y in zip(rows[r], rows[col], strict=True)]
    out = list(rates)
    for k, i in enumerate(free):
        out[i] = rows[k][size] / rows[k][k]
    return out


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile by the nearest rank above (the largest value below ``1 / (1 - q)``
    values)."""
    ordered = sorted(values)
    rank = math.ceil(q * len(ordered)) - 1
    return ordered[min(max(rank, 0), len(ordered) - 1)]


def fit(samples: Sequence[Sample], *, ridge: float = RIDGE) -> KindFactors | None:
    """The planning rates of the newest ``WINDOW`` readings (``samples`` newest first), None
    without a reading of known composition."""
    usable = [s for s in samples[:WINDOW] if s.measured > 0 and sum(s.composition) > 0]
    if not usable:
        return None
    prior = pooled(usable)
    a, b = normal_equations(usable, priors(prior), ridge)
    rates = solve(a, b, CALIBRATION_MIN, CALIBRATION_MAX)
    seen = [sum(s.composition[k] / sum(s.composition) for s in usable) for k in range(len(KINDS))]
    known = [rate for rate, held in zip(rates, seen, strict=True) if held >= SEEN]
    worst = max([*known, prior])
    planned = tuple(
        rate if held >= SEEN else max(rate, worst, UNSEEN[kind] if held < NEVER else 0.0)
        for kind, (rate, held) in enumerate(zip(rates, seen, strict=True))
    )
    fitted = KindFactors(tuple(rates))
    ratios = [s.measured / fitted.predicted(s.composition) for s in usable]
    upper = min(max(quantile(ratios, UPPER_QUANTILE), 1.0), UPPER_MAX)
    reach = tuple(
        math.ceil(max(s.composition[k] / sum(s.composition) for s in usable) * 1_000) / 1_000
        for k in range(len(KINDS))
    )
    return KindFactors(planned, upper, reach, round(worst, 6))
