"""When a ready summary is first used (pure): now, or once using it costs less than waiting.

A compression run writes its summary (and the clearings it makes free after it) when they are
ready; the request does not have to use them at once. Every summary changes the request from the
summary on, so its first use writes the provider's prompt cache again from there: at Anthropic's
prices a 60k-token history summarized to 12k costs 12k x 1.25 for that request, where the same
request without it reads 60k x 0.1 from the cache. A ready summary is therefore used from the
first request where one of these holds, checked in this order:

1. ``horizon`` is 0: summaries are used at once (the behaviour before activation existed);
2. the model's provider caches no prefixes (``CacheRules.read_price`` 1): nothing to keep warm;
3. the cache is cold: no request was assembled before, or the last one was longer ago than the
   provider's cache lifetime (``CacheRules.lifetime_seconds``): the next request writes its whole
   prefix anyway, so the smaller one is the cheaper one;
4. needed: the request without the summary, plus room for one more step of the size the last one
   added, would not fit the budget;
5. the prefix as sent now is below the provider's smallest cacheable prefix: it is not cached;
6. the saving over the next ``horizon`` requests pays for the rewrite. Waiting, each of them reads
   the current history from the cache (``without x read``); using it, the first writes the
   summarized history (``with x write``) and the others read it (``with x read``). The growth of
   each request is the same either way and cancels out, so the summary is used when
   ``with x write + (horizon - 1) x with x read <= horizon x without x read``.

Otherwise the summary waits: the request is built with the summary in use before it (or none).

The cache rules are named data per provider (``RULES``): Anthropic's published multipliers (a
5-minute write at 1.25x input, a read at 0.1x, a 5-minute lifetime refreshed by each hit, 1,024
tokens the least it caches); OpenAI's automatic caching (no write surcharge, cached input at the
model's discount, 1,024 tokens the least, kept 5 to 10 minutes idle by default and 24 hours with
``prompt_cache_retention="24h"``); Gemini's implicit caching (a 75 % discount on cached input);
DeepSeek's disk cache (cached input at a tenth). A provider not named caches nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass

from recap.core.counting.providers import ANTHROPIC, DEEPSEEK, GEMINI, OPENAI, model_name
from recap.core.counting.providers import provider_of as _provider_of

DEFAULT_HORIZON = 4
"""Requests a summary's saving must pay its cache rewrite back within (``RECAP_ACTIVATION_
HORIZON_REQUESTS``). An agent turn of a few tool calls is about four requests; past the turn the
user may stop, or come back after the cache has expired, when the summary is used for free. A
saving that takes longer than that to pay back is a bet on a future that often does not come."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheRules:
    """How one provider prices and keeps a cached prefix, relative to plain input tokens."""

    provider: str
    write_price: float  # a prefix token written to the cache
    read_price: float  # a prefix token read from it (1: no caching)
    lifetime_seconds: float  # idle time after which the cache is gone
    min_prefix_tokens: int = 1_024  # a shorter prefix is not cached


NO_CACHE = CacheRules(
    provider="none", write_price=1.0, read_price=1.0, lifetime_seconds=0.0, min_prefix_tokens=0
)
ANTHROPIC_RULES = CacheRules(
    provider=ANTHROPIC, write_price=1.25, read_price=0.1, lifetime_seconds=300.0
)
OPENAI_RULES = CacheRules(
    provider=OPENAI, write_price=1.0, read_price=0.5, lifetime_seconds=300.0
)  # gpt-4o family: cached input at half price
GEMINI_RULES = CacheRules(provider=GEMINI, write_price=1.0, read_price=0.25, lifetime_seconds=300.0)
DEEPSEEK_RULES = CacheRules(
    provider=DEEPSEEK,
    write_price=1.0,
    read_price=0.1,
    lifetime_seconds=3_600.0,
    min_prefix_tokens=64,
)
RULES: dict[str, CacheRules] = {
    ANTHROPIC: ANTHROPIC_RULES,
    OPENAI: OPENAI_RULES,
    GEMINI: GEMINI_RULES,
    DEEPSEEK: DEEPSEEK_RULES,
}
# OpenAI's cached-input discount by model family (the model's name starting so), newest first.
OPENAI_READ_PRICE: tuple[tuple[str, float], ...] = (
    ("gpt-5", 0.1),
    ("gpt-4.1", 0.25),
    ("o3", 0.25),
    ("o4", 0.25),
    ("gpt-4o", 0.5),
    ("o1", 0.5),
)
EXTENDED_LIFETIME_SECONDS = 24 * 3_600.0  # OpenAI's ``prompt_cache_retention="24h"``


def cache_rules(model: str | None, *, retention: str | None = None) -> CacheRules:
    """The cache rules of ``model``'s provider (OpenAI's discount by model family, its lifetime
    24 hours with the extended retention)."""
    name = (model or "").lower()
    provider = _provider_of(name)
    if provider != OPENAI:
        return RULES.get(provider, NO_CACHE)
    own = model_name(name)
    read = next((price for prefix, price in OPENAI_READ_PRICE if own.startswith(prefix)), None)
    rules = OPENAI_RULES
    if read is not None:
        rules = CacheRules(
            provider=OPENAI,
            write_price=1.0,
            read_price=read,
            lifetime_seconds=rules.lifetime_seconds,
        )
    if retention == "24h":
        rules = CacheRules(
            provider=OPENAI,
            write_price=1.0,
            read_price=rules.read_price,
            lifetime_seconds=EXTENDED_LIFETIME_SECONDS,
        )
    return rules


# the reasons, as ``stats`` and the log name them
AT_ONCE, UNCACHED, COLD, NEEDED, SHORT, PAYS, WAITS = (
    "at once",
    "no prompt cache",
    "cache cold",
    "needed",
    "prefix not cached",
    "saving pays",
    "waits",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Moment:
    """What the choice looks at, in estimated tokens of the history as sent."""

    rules: CacheRules
    idle_seconds: float | None  # since the last request was assembled (None: never)
    without: int  # the request as it would be sent without the ready summary
    with_summary: int  # the request with it (and the clearings it brings)
    budget: int  # the most the request may take
    next_step: int  # what one more step adds (the last step's growth)
    horizon: int = DEFAULT_HORIZON


@dataclass(frozen=True, slots=True)
class Activation:
    """Whether to use the ready summary now, and why."""

    use: bool
    reason: str


def rewrite_pays(rules: CacheRules, without: int, with_summary: int, horizon: int) -> bool:
    """Rule 6: over ``horizon`` requests, writing the summarized prefix once and reading it after
    costs no more than reading the current one from the cache each time."""
    using = with_summary * rules.write_price + (horizon - 1) * with_summary * rules.read_price
    waiting = horizon * without * rules.read_price
    return using <= waiting


def activate(moment: Moment) -> Activation:
    """Use the ready summary now, or let it wait (the module's rules, in order)."""
    rules = moment.rules
    if moment.horizon <= 0:
        return Activation(True, AT_ONCE)
    if rules.read_price >= 1:
        return Activation(True, UNCACHED)
    if moment.idle_seconds is None or moment.idle_seconds >= rules.lifetime_seconds:
        return Activation(True, COLD)
    if moment.without + max(moment.next_step, 0) > moment.budget:
        return Activation(True, NEEDED)
    if moment.without < rules.min_prefix_tokens:
        return Activation(True, SHORT)
    if rewrite_pays(rules, moment.without, moment.with_summary, moment.horizon):
        return Activation(True, PAYS)
    return Activation(False, WAITS)
