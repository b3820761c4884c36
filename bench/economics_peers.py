"""The bill of a conversation under a provider's cache rules (``Meter``), and the strategies
users pick instead of Recap, each at its documented defaults (see ``bench.economics``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from recap.core.decision import activation as act
from recap.core.decision.cachecost import _Renderer
from recap.core.values.records import Msg

MODEL = "gpt-4o-mini"
DOCUMENTED_WINDOW = 200_000  # the window the peers' token thresholds are documented for
SUMMARY_PROMPT_TOKENS = 800  # a summarizer's own instructions
INSTRUCTION_TOKENS = 300  # the instruction after a chat's prefix
LANGCHAIN_TRIM = 4_000
AGENTS_ITEMS = 10


@dataclass(frozen=True)
class Pricing:
    name: str
    rules: act.CacheRules
    output: float  # one output token in input tokens


PRICINGS = (
    Pricing("anthropic", act.ANTHROPIC_RULES, 5.0),
    Pricing("openai", act.cache_rules(MODEL), 4.0),
)
Block = tuple[object, int]  # a request's unit as sent (its identity) and its tokens


@dataclass
class Bill:
    """One strategy's totals over one run under one pricing."""

    cost: float = 0.0
    requests: int = 0
    over_window: int = 0
    summary_calls: int = 0
    summary_input: int = 0
    summary_cached: int = 0

    def merge(self, other: Bill) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Meter:
    """Prices a run's requests one after another under one pricing."""

    def __init__(self, pricing: Pricing, window: int) -> None:
        self.pricing, self.window = pricing, window
        self.previous: list[Block] = []
        self.last_at: float | None = None
        self.bill = Bill()

    def cached(self, blocks: Sequence[Block], at: float) -> int:
        rules = self.pricing.rules
        if self.last_at is None or at - self.last_at >= rules.lifetime_seconds:
            return 0
        shared = 0
        for old, new in zip(self.previous, blocks, strict=False):
            if old != new:
                break
            shared += new[1]
        return shared if shared >= rules.min_prefix_tokens else 0

    def request(self, blocks: list[Block], at: float, *, newest_result: bool = False) -> None:
        """One request; over the window with a tool result last (``newest_result``), that
        result is sent as its head and tail to fit, as every strategy would have to (Recap's
        assembly does: ``shortened``), so that the over-window count is the strategy's own."""
        blocks = fitted(blocks, self.window, newest_result=newest_result)
        total = sum(count for _, count in blocks)
        hit = self.cached(blocks, at)
        rules = self.pricing.rules
        self.bill.cost += (total - hit) * rules.write_price + hit * rules.read_price
        self.bill.requests += 1
        self.bill.over_window += total > self.window
        self.previous, self.last_at = blocks, at

    def summarize(
        self, uncached: int, output: int, *, on_prefix: list[Block] | None, at: float
    ) -> None:
        """A summarizer call: ``on_prefix`` the chat's last request it starts with (read from the
        cache when warm), then ``uncached`` tokens of its own, and ``output`` tokens out."""
        rules = self.pricing.rules
        hit = self.cached(on_prefix, at) if on_prefix is not None else 0
        prefix = sum(c for _, c in on_prefix) if on_prefix is not None else 0
        fresh = prefix - hit + uncached
        write = rules.write_price if on_prefix is not None else 1.0
        self.bill.cost += fresh * write + hit * rules.read_price + output * self.pricing.output
        self.bill.summary_calls += 1
        self.bill.summary_input += prefix + uncached
        self.bill.summary_cached += hit
        if on_prefix is not None:
            self.last_at = at  # the call kept the prefix warm


def fitted(blocks: list[Block], window: int, *, newest_result: bool) -> list[Block]:
    """The request with its newest tool result cut to its head and tail when it is over the
    window with that result last (``Meter.request``)."""
    total = sum(count for _, count in blocks)
    if total <= window or not newest_result or not blocks:
        return blocks
    key, count = blocks[-1]
    return [*blocks[:-1], ((key, "shortened"), max(count - (total - window), 0))]


def summary_size(replaced: int, window: int) -> int:
    return max(min(replaced // 5, 2_000, window // 10), 200)


@dataclass
class Run:
    """One conversation: its messages, where each request ends and when it is sent."""

    name: str
    branch: list[Msg]
    ends: list[int]
    times: list[float]
    window: int


# --- the peers -----------------------------------------------------------------------------------


Strategy = Callable[[Run, Pricing, "_Renderer"], Bill]


def _full(run: Run, renderer: _Renderer, start: int, end: int) -> list[Block]:
    return [(("m", m.id), renderer.render(m, None)[1]) for m in run.branch[start:end]]


def _after_summary(
    run: Run, renderer: _Renderer, start: int, end: int, summary: int | None
) -> list[Block]:
    """The stored system prompt (it stays whatever is summarized), the summary, then the
    messages from ``start``."""
    head: list[Block] = []
    if summary:
        if start > 0 and run.branch[0].role == "system":
            head.append(_full(run, renderer, 0, 1)[0])
        head.append((("sum", start), summary))
    return [*head, *_full(run, renderer, start, end)]


def _tool_last(run: Run, end: int) -> bool:
    return run.branch[end - 1].role == "tool"


def none(run: Run, pricing: Pricing, renderer: _Renderer) -> Bill:
    meter = Meter(pricing, run.window)
    for end, at in zip(run.ends, run.times, strict=True):
        meter.request(_full(run, renderer, 0, end), at, newest_result=_tool_last(run, end))
    return meter.bill


def _compacting(trigger: float, *, server_clear: bool) -> Strategy:
    """Summarize everything on the chat's prefix past ``trigger`` of the window (``compact95``;
    with ``server_clear`` Anthropic's server-side editing before it)."""

    def strategy(run: Run, pricing: Pricing, renderer: _Renderer) -> Bill:
        meter = Meter(pricing, run.window)
        start, summary = 0, None  # messages before ``start`` are summarized
        scale = run.window / DOCUMENTED_WINDOW
        for end, at in zip(run.ends, run.times, strict=True):
            blocks = _after_summary(run, renderer, start, end, summary)
            if server_clear:
                blocks = _clear_tool_uses(run, blocks, int(100_000 * scale), keep=3)
            total = sum(c for _, c in blocks)
            if total > trigger * run.window and end - start > 2:
                size = summary_size(total, run.window)
                meter.summarize(INSTRUCTION_TOKENS, size, on_prefix=blocks, at=at)
                start, summary = end - 1, size  # the newest message stays
                blocks = _after_summary(run, renderer, start, end, summary)
            meter.request(blocks, at, newest_result=_tool_last(run, end))
        return meter.bill

    return strategy


def _clear_tool_uses(run: Run, blocks: list[Block], trigger: int, *, keep: int) -> list[Block]:
    """ClearToolUsesEdit / clear_tool_uses: past ``trigger``, every tool result but the last
    ``keep`` as a short placeholder, recomputed on each request."""
    if sum(c for _, c in blocks) <= trigger:
        return blocks
    by_id = {m.id: m for m in run.branch}
    results = [i for i, (key, _) in enumerate(blocks) if _is_tool(key, by_id)]
    cleared = set(results[:-keep] if keep else results)
    return [
        ((key, "cleared"), 8) if i in cleared else (key, c) for i, (key, c) in enumerate(blocks)
    ]


def _is_tool(key: object, by_id: dict[int, Msg]) -> bool:
    return isinstance(key, tuple) and key[0] == "m" and by_id[key[1]].role == "tool"


def langchain(run: Run, pricing: Pricing, renderer: _Renderer) -> Bill:
    meter = Meter(pricing, run.window)
    start, summary = 0, None
    scale = run.window / DOCUMENTED_WINDOW
    for end, at in zip(run.ends, run.times, strict=True):
        kept = _full(run, renderer, start, end)
        total = sum(c for _, c in kept) + (summary or 0)
        if total > 0.85 * run.window and end - start > 20:
            cut = _pair_safe(run.branch, end - 20)
            replaced = sum(c for _, c in _full(run, renderer, start, cut)) + (summary or 0)
            summary = summary_size(replaced, run.window)
            meter.summarize(
                SUMMARY_PROMPT_TOKENS + min(replaced, LANGCHAIN_TRIM),
                summary,
                on_prefix=None,
                at=at,
            )
            start = cut
            kept = _full(run, renderer, start, end)
        blocks = _after_summary(run, renderer, start, end, summary)
        meter.request(
            _clear_tool_uses(run, blocks, int(100_000 * scale), keep=3),
            at,
            newest_result=_tool_last(run, end),
        )
    return meter.bill


def _pair_safe(branch: Sequence[Msg], cut: int) -> int:
    """The cut moved back past tool results, so no result is kept without its call."""
    while cut > 0 and branch[cut].role == "tool":
        cut -= 1
    return max(cut, 0)


def agents_sdk(run: Run, pricing: Pricing, renderer: _Renderer) -> Bill:
    meter = Meter(pricing, run.window)
    start, summary = 0, None
    for end, at in zip(run.ends, run.times, strict=True):
        candidates = [m for m in run.branch[start:end] if m.role not in ("user", "system")]
        if len(candidates) >= AGENTS_ITEMS:
            whole = sum(c for _, c in _full(run, renderer, start, end)) + (summary or 0)
            summary = summary_size(whole, run.window)
            meter.summarize(whole, summary, on_prefix=None, at=at)
            start = end
        blocks = _after_summary(run, renderer, start, end, summary)
        meter.request(blocks, at, newest_result=_tool_last(run, end))
    return meter.bill


PEERS: dict[str, Strategy] = {
    "none": none,
    "compact95": _compacting(0.95, server_clear=False),
    "langchain": langchain,
    "agents_sdk": agents_sdk,
    "anthropic": _compacting(0.75, server_clear=True),
}
