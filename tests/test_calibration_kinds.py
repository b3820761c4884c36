"""Calibration per kind of content (pure): the classification of text into kinds
(``core.counting.kinds``) and the rates fitted per kind from readings
(``core.counting.calibration``), in tables and in seeded random cases against a simple
reference (every choice of bounds tried, the best feasible one kept)."""

from __future__ import annotations

import base64
import itertools
import json
import random
from datetime import UTC, datetime

import pytest

from recap.core.counting import budget as budgets
from recap.core.counting import calibration as cal
from recap.core.counting import kinds
from recap.core.counting.tokens import CALIBRATION_MAX, CALIBRATION_MIN
from recap.core.values.profile import Reading

NOW = datetime(2026, 1, 1, tzinfo=UTC)
B64 = base64.b64encode(random.Random(0).randbytes(300)).decode()
HEX = random.Random(1).randbytes(40).hex()


def dominant(text: str) -> str:
    weights = kinds.text_weights(text)
    return kinds.KINDS[max(range(len(weights)), key=weights.__getitem__)]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("The parcel was left with the neighbour, as the customer asked.", "prose"),
        ('{"order_id": "A123", "status": "shipped", "items": [1, 2]}', "code"),
        ("def refund(order_id: str) -> dict[str, object]: return {}", "code"),
        ("if (x === 1) { notify(a, [b, c]); }", "code"),
        ("4821 99812731 1827361 2837 91827364 123", "digits"),
        (B64, "other"),
        (HEX, "other"),
        ("x" * 80, "prose"),  # a long run of one letter is not dense data
        ("", "prose"),
    ],
)
def test_text_is_classified_by_its_kind(text: str, kind: str) -> None:
    assert dominant(text) == kind if text else kinds.text_weights(text) == (0, 0, 0, 0)


def test_digits_count_by_groups_of_three() -> None:
    """Groups of three, a run's last group a whole token on average: (digits + 2 x runs) / 3,
    within two thirds of a token per run of the exact 1 + 1 + 1 + 2 + 3."""
    weight = kinds.text_weights("1 12 123 1234 1234567")[kinds.DIGITS]
    assert weight == pytest.approx((17 + 2 * 5) / 3)
    assert 1 + 1 + 1 + 2 + 3 <= weight <= 1 + 1 + 1 + 2 + 3 + 5 * 2 / 3


@pytest.mark.parametrize("total", [0, 1, 17, 5_000])
def test_a_composition_adds_up_to_the_estimate(total: int) -> None:
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "order 123456789"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "lookup", "arguments": '{"key": "A1"}'}}],
        },
        {"role": "tool", "content": json.dumps({"rows": list(range(30))})},
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    parts = kinds.composition(messages, tools, total)
    assert len(parts) == len(kinds.KINDS)
    assert sum(parts) == pytest.approx(total)
    if total:
        assert parts[kinds.CODE] > parts[kinds.PROSE] > 0 and parts[kinds.DIGITS] > 0


def test_a_request_without_text_is_all_prose() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + B64}}
    parts = kinds.composition([{"role": "user", "content": [image]}], None, 100)
    assert parts == (100.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("stored", "read"),
    [
        ("1.0 2.0 3.0 4.0", (1.0, 2.0, 3.0, 4.0)),
        (None, None),
        ("", None),
        ("1 2 3", None),
        ("1 2 x 4", None),
        ("1 2 -3 4", None),
    ],
)
def test_stored_compositions_read_back(stored: str | None, read: tuple[float, ...]) -> None:
    assert kinds.decode(stored) == read
    if read is not None:
        assert kinds.decode(kinds.encode(read)) == read


@pytest.mark.parametrize(
    ("stored", "ok"),
    [("1.1 1.5 2.0 1.8 1.02", True), ("1 1 1 1", False), ("1 1 1 1 nan", False), (None, False)],
)
def test_stored_rates_read_back(stored: str | None, ok: bool) -> None:
    fitted = cal.KindFactors.decode(stored)
    assert (fitted is not None) == ok
    if fitted is not None:
        assert cal.KindFactors.decode(fitted.encode()) == fitted


def provider(rates: tuple[float, ...], composition: tuple[float, ...]) -> int:
    return round(sum(x * r for x, r in zip(composition, rates, strict=True)))


def test_one_reading_gives_its_ratio_to_every_kind() -> None:
    composition = (700.0, 300.0, 0.0, 0.0)
    fitted = cal.fit([cal.Sample(composition, 1_300)])
    assert fitted is not None
    assert fitted.rates[:2] == pytest.approx((1.3,) * 2, abs=1e-6)
    assert fitted.rates[kinds.DIGITS] == fitted.rates[kinds.OTHER] == CALIBRATION_MAX  # unseen
    assert fitted.upper == pytest.approx(1.0, abs=1e-6)
    assert fitted.factor(composition) == pytest.approx(1.3, abs=1e-6)


def test_one_reading_holding_digits_keeps_them_at_the_most_they_may_count() -> None:
    """One reading cannot tell the digits' rate from the prose's: the fit explains it with the
    digits where a provider may count them (twice tiktoken), not at the reading's average."""
    composition = (600.0, 300.0, 100.0, 0.0)
    fitted = cal.fit([cal.Sample(composition, 1_300)])
    assert fitted is not None
    assert fitted.rates[kinds.DIGITS] >= 1.95
    assert fitted.predicted(composition) == pytest.approx(1_300, rel=0.01)
    assert fitted.factor(composition) >= 1.3 * 0.99


def test_no_reading_of_known_composition_fits_nothing() -> None:
    assert cal.fit([]) is None
    assert cal.fit([cal.Sample((0.0, 0.0, 0.0, 0.0), 100)]) is None


def test_the_rates_of_a_mixed_history_are_learned() -> None:
    """Readings of varied mixes of prose (1.05), code (1.6) and digits (2.0): each rate is
    learned, and a request heavy in code is planned near 1.6, not at the mix's average."""
    rng = random.Random(5)
    truth = (1.05, 1.6, 2.0, 1.0)
    samples = []
    for _ in range(16):
        composition = (rng.uniform(200, 3_000), rng.uniform(0, 2_000), rng.uniform(0, 400), 0.0)
        samples.append(cal.Sample(composition, provider(truth, composition)))
    fitted = cal.fit(samples)
    assert fitted is not None
    for kind in (kinds.PROSE, kinds.CODE):
        assert fitted.rates[kind] == pytest.approx(truth[kind], abs=0.03)
    assert fitted.rates[kinds.DIGITS] == pytest.approx(2.0, abs=0.15)  # a small share: the pull
    heavy = (500.0, 5_000.0, 0.0, 0.0)
    mean = cal.pooled(samples)
    assert mean < 1.45 < fitted.factor(heavy)
    assert fitted.factor(heavy) >= provider(truth, heavy) / sum(heavy)


def test_an_unseen_kind_is_planned_at_the_worst_rate_seen() -> None:
    """Prose and code seen: digits and dense strings, never seen, planned at the most a kind
    may count; a kind seen a little, at least at the worst rate seen."""
    truth = (1.0, 1.5, 2.0, 2.0)
    rng = random.Random(9)
    samples = []
    for _ in range(8):
        composition = (rng.uniform(500, 2_000), rng.uniform(100, 900), 0.0, 0.0)
        samples.append(cal.Sample(composition, provider(truth, composition)))
    fitted = cal.fit(samples)
    assert fitted is not None
    assert fitted.rates[kinds.DIGITS] == fitted.rates[kinds.OTHER] == CALIBRATION_MAX
    assert fitted.rates[kinds.CODE] == pytest.approx(1.5, abs=0.05)


def test_the_plan_takes_the_upper_residual_not_the_mean() -> None:
    """Readings the rates explain only up to +-4 %: the plan is raised by the upper residual."""
    rng = random.Random(2)
    samples = []
    for n in range(12):
        composition = (rng.uniform(500, 2_000), 0.0, 0.0, 0.0)
        noise = 1.04 if n % 2 else 0.96
        samples.append(cal.Sample(composition, round(1.2 * noise * composition[0])))
    fitted = cal.fit(samples)
    assert fitted is not None
    assert 1.03 <= fitted.upper <= 1.05
    for sample in samples:
        assert fitted.factor(sample.composition) * sum(sample.composition) >= sample.measured - 1


def test_the_upper_residual_is_capped() -> None:
    samples = [cal.Sample((1_000.0, 0, 0, 0), 600), cal.Sample((1_000.0, 0, 0, 0), 1_900)]
    fitted = cal.fit(samples)
    assert fitted is not None and fitted.upper == cal.UPPER_MAX


def test_the_budget_plans_with_the_request_s_own_mix() -> None:
    fitted = cal.KindFactors((1.0, 1.6, 2.0, 2.0), 1.0)
    reading = Reading(
        estimated=1_000,
        measured=1_200,
        leaf_id=5,
        at=NOW,
        state=None,
        kinds=(*fitted.rates, fitted.upper),
    )
    single = budgets.calibration_factor(reading, leaf_id=5, now=NOW)
    assert single == pytest.approx(1.2)
    code = budgets.calibration_factor(reading, leaf_id=5, now=NOW, composition=(0, 100, 0, 0))
    assert code == pytest.approx(1.6)
    # a request poorer in code than the latest reading never plans below that reading's factor
    prose = budgets.calibration_factor(reading, leaf_id=5, now=NOW, composition=(100, 0, 0, 0))
    assert prose == pytest.approx(1.2)
    plain = Reading(
        estimated=1_000, measured=1_200, leaf_id=5, at=NOW
    )  # no rates fitted: the single factor
    assert budgets.calibration_factor(plain, leaf_id=5, now=NOW, composition=(0, 1, 0, 0)) == (
        pytest.approx(1.2)
    )


# --- seeded random cases against a reference ----------------------------------------------------


def _solve_linear(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (None for a singular system)."""
    n = len(b)
    m = [[*row, value] for row, value in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-14:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                ratio = m[r][col] / m[col][col]
                m[r] = [x - ratio * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def reference(a: list[list[float]], b: list[float], low: float, high: float) -> list[float]:
    """The box-constrained minimum by brute force: every kind free, at its low bound or at its
    high bound; the free ones solved exactly; the best point within the box kept."""
    n = len(b)
    best: tuple[float, list[float]] | None = None
    for choice in itertools.product(("free", "low", "high"), repeat=n):
        fixed = {i: (low if c == "low" else high) for i, c in enumerate(choice) if c != "free"}
        free = [i for i in range(n) if i not in fixed]
        rates = [fixed.get(i, 0.0) for i in range(n)]
        if free:
            sub_a = [[a[i][j] for j in free] for i in free]
            sub_b = [b[i] - sum(a[i][j] * fixed[j] for j in fixed) for i in free]
            solved = _solve_linear(sub_a, sub_b)
            if solved is None:
                continue
            for i, value in zip(free, solved, strict=True):
                rates[i] = value
        if any(r < low - 1e-12 or r > high + 1e-12 for r in rates):
            continue
        value = cal.objective(a, b, rates)
        if best is None or value < best[0]:
            best = (value, rates)
    assert best is not None
    return best[1]


@pytest.mark.parametrize("seed", range(60))
def test_the_fit_finds_the_reference_minimum(seed: int) -> None:
    rng = random.Random(seed)
    truth = tuple(rng.uniform(0.3, 2.5) for _ in kinds.KINDS)  # some outside the bounds
    samples = []
    for _ in range(rng.randrange(1, 20)):
        composition = tuple(
            rng.uniform(0, 3_000) if rng.random() < 0.7 else 0.0 for _ in kinds.KINDS
        )
        noise = rng.uniform(0.9, 1.1)
        measured = round(noise * sum(x * r for x, r in zip(composition, truth, strict=True)))
        samples.append(cal.Sample(composition, max(measured, 1)))
    usable = [s for s in samples[: cal.WINDOW] if sum(s.composition) > 0]
    if not usable:
        return
    a, b = cal.normal_equations(usable, cal.priors(cal.pooled(usable)), cal.RIDGE)
    ours = cal.solve(a, b, CALIBRATION_MIN, CALIBRATION_MAX)
    expected = reference(a, b, CALIBRATION_MIN, CALIBRATION_MAX)
    assert cal.objective(a, b, ours) <= cal.objective(a, b, expected) + 1e-9
    assert ours == pytest.approx(expected, abs=1e-5)
    fitted = cal.fit(samples)
    assert fitted is not None
    assert all(CALIBRATION_MIN <= r <= CALIBRATION_MAX for r in fitted.rates)
    assert 1.0 <= fitted.upper <= cal.UPPER_MAX
    # planned rates are never below the fitted ones
    assert all(p >= f - 1e-12 for p, f in zip(fitted.rates, ours, strict=True))


def test_a_kind_seen_a_little_is_planned_at_the_worst_rate_seen() -> None:
    samples = [cal.Sample((900.0, 0.0, 0.0, 50.0), 1_000), cal.Sample((800.0, 0.0, 0.0, 60.0), 900)]
    fitted = cal.fit(samples)
    assert fitted is not None
    held = sum(s.composition[kinds.OTHER] / sum(s.composition) for s in samples)
    assert cal.NEVER <= held < cal.SEEN
    assert fitted.rates[kinds.OTHER] >= max(fitted.rates[kinds.PROSE], cal.pooled(samples)) - 1e-9
    assert fitted.rates[kinds.OTHER] < CALIBRATION_MAX


# --- a kind the readings hardly pinned down, then a request heavy in it --------------------------


def _carried_attachment(seed: int) -> tuple[list[cal.Sample], tuple[float, ...], int]:
    """Readings of one conversation (prose, code, digits, and the same few dense tokens sent
    again with most requests: an attachment carried along), then a request whose dense share is
    ten times any reading's; the provider counts each kind at its own rate (dense 1.7-2.0,
    digits 2.0). Newest reading first, as ``fit`` takes them."""
    rng = random.Random(seed)
    truth = (rng.uniform(1.0, 1.15), rng.uniform(1.3, 1.7), 2.0, rng.uniform(1.7, 2.0))
    carried = rng.uniform(20, 250)
    samples = []
    for _ in range(rng.randrange(4, 17)):
        composition = (
            rng.uniform(300, 900),
            rng.uniform(400, 1_100),
            rng.uniform(30, 300),
            carried if rng.random() < 0.8 else 0.0,
        )
        samples.append(cal.Sample(composition, provider(truth, composition)))
    request = (rng.uniform(200, 600), rng.uniform(500, 1_000), rng.uniform(30, 200), 0.0)
    request = (*request[:3], rng.uniform(400, 900))
    return samples[::-1], request, provider(truth, request)


@pytest.mark.parametrize("seed", range(60))
def test_a_request_heavy_in_a_kind_the_readings_hardly_held_is_not_planned_short(
    seed: int,
) -> None:
    """The doors' over-window requests (3,134 provider tokens into 3,000): readings explained
    to half a percent with the dense rate at 1.5, then a tool output a third base64 planned
    with it, 10-12 % short. Past the share a kind held in the readings it is planned at its
    cautious rate, and what the readings do not pin down of digits and dense strings stays at
    the most they may count: the plan is within 1 % of the provider's count or above it (the
    safety margin, 5 %, covers the rest)."""
    samples, request, truth = _carried_attachment(seed)
    fitted = cal.fit(samples)
    assert fitted is not None
    assert fitted.factor(request) * sum(request) >= 0.99 * truth
    latest = samples[0]
    reading = Reading(
        estimated=round(sum(latest.composition)),
        measured=latest.measured,
        leaf_id=5,
        at=NOW,
        state=None,
        kinds=fitted.values(),
    )
    planned = budgets.calibration_factor(reading, leaf_id=5, now=NOW, composition=request)
    assert planned * sum(request) >= 0.99 * truth


@pytest.mark.parametrize(
    ("readings", "request_", "beyond"),
    [
        # prose and code seen up to 60 % code: a request all code plans its 40 % past at the
        # worst rate seen (code's own)
        ([(400.0, 600.0, 0.0, 0.0)], (0.0, 1_000.0, 0.0, 0.0), "code"),
        # digits seen at 5 %: a request 40 % digits plans the 35 % past at twice tiktoken
        ([(900.0, 50.0, 50.0, 0.0)], (600.0, 0.0, 400.0, 0.0), "digits"),
    ],
)
def test_a_rate_holds_only_as_far_as_the_readings_went(
    readings: list[tuple[float, ...]], request_: tuple[float, ...], beyond: str
) -> None:
    fitted = cal.fit([cal.Sample(c, provider((1.1, 1.5, 2.0, 2.0), c)) for c in readings])
    assert fitted is not None
    kind = kinds.KINDS.index(beyond)
    assert fitted.reach[kind] == pytest.approx(max(c[kind] / sum(c) for c in readings), abs=1e-3)
    assert fitted.beyond(kind) >= fitted.rates[kind]
    within = fitted.reach[kind] * sum(request_)
    expected = (
        sum(x * r for k, (x, r) in enumerate(zip(request_, fitted.rates, strict=True)) if k != kind)
        + within * fitted.rates[kind]
        + (request_[kind] - within) * fitted.beyond(kind)
    )
    assert fitted.planned(request_) == pytest.approx(expected)
    assert fitted.planned(request_) > fitted.predicted(request_)
    stored = cal.KindFactors.decode(fitted.encode())
    assert stored is not None and len(fitted.encode()) <= 96  # the column's size
    assert stored.values() == pytest.approx(fitted.values(), abs=1e-3)


def test_rates_stored_before_the_reach_read_back_without_it() -> None:
    stored = cal.KindFactors.decode("1.1 1.5 2 2 1.01")
    assert stored == cal.KindFactors((1.1, 1.5, 2.0, 2.0), 1.01)
    assert stored is not None and stored.factor((0.0, 100.0, 0.0, 0.0)) == pytest.approx(1.515)
