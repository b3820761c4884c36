"""Summary activation: a ready summary is used now or waits (``core.decision.activation``), and
the request path's choice between it and the summary in use (``core.storage.activation``)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from recap.core.decision import activation as act
from recap.core.decision.activation import (
    ANTHROPIC_RULES,
    NO_CACHE,
    CacheRules,
    Moment,
    activate,
    cache_rules,
)
from recap.core.storage import activation as choosing
from recap.core.values.records import ClearingRec, SummaryRec

WARM = 30.0  # seconds since the last request: within every provider's lifetime


def moment(**changes: object) -> Moment:
    base: dict[str, object] = {
        "rules": ANTHROPIC_RULES,
        "idle_seconds": WARM,
        "without": 60_000,
        "with_summary": 20_000,
        "budget": 150_000,
        "next_step": 2_000,
        "horizon": 4,
    }
    base.update(changes)
    return Moment(**base)  # type: ignore[arg-type]


TABLE = [
    # (name, changes, use, reason)
    ("warm and fits: waits", {}, False, act.WAITS),
    ("cold: idle past the lifetime", {"idle_seconds": 301.0}, True, act.COLD),
    ("cold: at the lifetime", {"idle_seconds": 300.0}, True, act.COLD),
    ("cold: never assembled", {"idle_seconds": None}, True, act.COLD),
    ("needed: no room for the next step", {"without": 149_000}, True, act.NEEDED),
    ("needed: the request alone is over", {"without": 151_000, "next_step": 0}, True, act.NEEDED),
    (
        "fits with the next step exactly",
        {"without": 148_000, "with_summary": 50_000},
        False,
        act.WAITS,
    ),
    ("saving pays: a tiny summary", {"with_summary": 10_000}, True, act.PAYS),
    # 4 x 60k x 0.1 = 24k; 15.48k x (1.25 + 0.3) = 23.99k: pays just
    ("saving pays at the edge", {"with_summary": 15_480}, True, act.PAYS),
    ("saving just short", {"with_summary": 15_490}, False, act.WAITS),
    ("a longer horizon pays", {"horizon": 40}, True, act.PAYS),
    ("horizon 0: at once", {"horizon": 0}, True, act.AT_ONCE),
    ("no prompt cache", {"rules": NO_CACHE}, True, act.UNCACHED),
    ("prefix too short to cache", {"without": 900, "with_summary": 600}, True, act.SHORT),
    (
        "OpenAI extended retention: warm after an hour",
        {"rules": cache_rules("gpt-5", retention="24h"), "idle_seconds": 3_600.0},
        False,
        act.WAITS,
    ),
    (
        "OpenAI default retention: cold after an hour",
        {"rules": cache_rules("gpt-5"), "idle_seconds": 3_600.0},
        True,
        act.COLD,
    ),
    (
        "OpenAI pays where Anthropic waits (no write surcharge)",
        {"rules": cache_rules("gpt-5"), "with_summary": 18_000},
        True,
        act.PAYS,
    ),
    ("Anthropic waits at the same numbers", {"with_summary": 18_000}, False, act.WAITS),
]


@pytest.mark.parametrize(("name", "changes", "use", "reason"), TABLE, ids=[r[0] for r in TABLE])
def test_activation_table(name: str, changes: dict[str, object], use: bool, reason: str) -> None:
    decided = activate(moment(**changes))
    assert (decided.use, decided.reason) == (use, reason), name


def test_cache_rules_by_model() -> None:
    assert cache_rules("anthropic/claude-sonnet-4-5") == ANTHROPIC_RULES
    assert cache_rules("gpt-4o-mini").read_price == 0.5
    assert cache_rules("openai/gpt-4.1").read_price == 0.25
    assert cache_rules("gpt-5-mini").read_price == 0.1
    assert cache_rules("gpt-5", retention="24h").lifetime_seconds == 24 * 3600
    assert cache_rules("gemini/gemini-2.5-flash").read_price == 0.25
    assert cache_rules("deepseek/deepseek-chat").read_price == 0.1


def reference(m: Moment) -> bool:
    """The rules read straight from the issue: cheaper over the next requests, or needed."""
    r = m.rules
    if m.horizon == 0 or r.read_price == 1:
        return True
    cold = m.idle_seconds is None or m.idle_seconds >= r.lifetime_seconds
    needed = m.without + m.next_step > m.budget
    if cold or needed or m.without < r.min_prefix_tokens:
        return True
    # price each of the next ``horizon`` requests both ways, one at a time
    wait_cost = use_cost = 0.0
    for step in range(m.horizon):
        wait_cost += m.without * r.read_price
        use_cost += m.with_summary * (r.write_price if step == 0 else r.read_price)
    return use_cost <= wait_cost + 1e-9


def test_activation_random_against_reference() -> None:
    rng = random.Random(41)
    rules = [ANTHROPIC_RULES, NO_CACHE, cache_rules("gpt-4o"), cache_rules("gpt-5")]
    rules.append(
        CacheRules(
            provider="x",
            write_price=2.0,
            read_price=0.05,
            lifetime_seconds=60.0,
            min_prefix_tokens=0,
        )
    )
    for _ in range(3_000):
        without = rng.randrange(0, 200_000)
        m = Moment(
            rules=rng.choice(rules),
            idle_seconds=rng.choice([None, rng.uniform(0, 600)]),
            without=without,
            with_summary=rng.randrange(0, max(without, 1) + 1),
            budget=rng.randrange(1_000, 200_000),
            next_step=rng.randrange(0, 10_000),
            horizon=rng.randrange(0, 12),
        )
        assert activate(m).use == reference(m), m


# --- the request path's choice ------------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def summary(sid: int, cutoff: int, tokens: int, *, pending: bool) -> SummaryRec:
    return SummaryRec(
        id=sid,
        cutoff_message_id=cutoff,
        previous_summary_id=None,
        text="s",
        tokens=tokens,
        created_at=T0 + timedelta(minutes=sid),
        pending=pending,
    )


def context(idle: float | None, *, batch: dict[int, ClearingRec] | None = None) -> choosing.Context:
    return choosing.Context(
        rules=ANTHROPIC_RULES,
        horizon=4,
        idle_seconds=idle,
        sent_leaf=9,
        clearings_before=lambda _moment: dict(batch or {}),
    )


PATH = list(range(1, 11))
STORED = [1_000] * 10  # 10k tokens over ten messages


def test_choice_waits_warm_and_keeps_the_batch_back() -> None:
    in_use = summary(1, 2, 500, pending=False)
    ready = summary(2, 6, 500, pending=True)
    after_run = {8: ClearingRec(message_id=8, reason="post_summary", tokens_reclaimed=900)}
    chosen = choosing.choose([in_use, ready], PATH, STORED, after_run, 50_000, context(WARM))
    assert chosen.summary == in_use and chosen.waiting == ready and chosen.activated is None
    assert chosen.clearings == {}  # the run's clearings wait with their summary


def test_choice_uses_it_cold_with_its_clearings() -> None:
    ready = summary(2, 6, 500, pending=True)
    after_run = {8: ClearingRec(message_id=8, reason="post_summary", tokens_reclaimed=900)}
    chosen = choosing.choose([ready], PATH, STORED, after_run, 50_000, context(400.0))
    assert chosen.summary == ready and chosen.activated == ready and chosen.reason == act.COLD
    assert chosen.clearings == after_run


def test_choice_uses_it_when_needed() -> None:
    ready = summary(2, 6, 500, pending=True)
    # without it: 10k; the last step added 1k (message 10): 11k does not fit 10.5k
    chosen = choosing.choose([ready], PATH, STORED, {}, 10_500, context(WARM))
    assert chosen.activated == ready and chosen.reason == act.NEEDED


def test_choice_in_use_and_without_context() -> None:
    done = summary(1, 6, 500, pending=False)
    assert choosing.choose([done], PATH, STORED, {}, None, None).summary == done
    ready = summary(2, 8, 500, pending=True)
    as_of = choosing.choose([done, ready], PATH, STORED, {}, None, None)
    assert as_of.summary == done and as_of.waiting == ready


def test_sent_tokens() -> None:
    cleared = {9: ClearingRec(message_id=9, reason="idle", tokens_reclaimed=400)}
    assert choosing.sent_tokens(PATH, STORED, None, cleared) == 9_600
    # the root, the summary, then messages 7..10 less the clearing
    assert choosing.sent_tokens(PATH, STORED, summary(1, 6, 300, pending=False), cleared) == (
        1_000 + 300 + 4_000 - 400
    )
