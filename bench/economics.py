"""What a whole conversation costs: Recap against what users pick instead, priced by each
provider's prompt-cache rules, summarizer calls included.

Runs: the shared agent runs (SWE-agent, OpenHands, tau-bench) in an 8k window, where most of
them outgrow it, and long generated agent chats (seeded; tool results of 0.3k-4k tokens) in a
64k window. Each assistant step is one request; the real runs have one idle gap of 10 minutes at
their middle step (past every cache lifetime), the generated chats a gap drawn per step.

Pricing (relative to one plain input token, ``core.decision.activation``'s named data): the part
of a request identical to the previous request's start (whole blocks, within the cache lifetime,
at least the provider's least cacheable prefix) is read from the cache, the rest written (every
strategy is given ideal cache marks: Anthropic 1.25 write, 0.1 read, 5 minutes; OpenAI gpt-4o
mini: 1 and 0.5, 5 minutes). A summarizer's output is priced at the model's output price
(Anthropic 5x input, gpt-4o-mini 4x). Every summary is sized alike: a fifth of what it replaces,
at least 200 and at most 2,000 tokens or a tenth of the window.

Strategies, each at its documented defaults, token thresholds scaled from the 200k window they
are documented for to the run's window:

- ``none``: the whole history every request (no management; over the window where it grows);
- ``compact95``: the coding agents' auto-compact: at 95 % of the window, summarize everything
  on the chat's own prefix (a cached read) and go on from the summary;
- ``langchain``: ``SummarizationMiddleware`` (its default trigger is None, which never
  summarizes, so deepagents' model-aware trigger: 85 % of the window; its default
  ``keep=("messages", 20)``; ``trim_tokens_to_summarize=4000`` of input, its own prompt, so
  uncached) with ``ContextEditingMiddleware(ClearToolUsesEdit())`` (trigger 100k of 200k, keep
  3, clear_at_least 0: applied to each request, not stored, so the cleared edge moves);
- ``agents_sdk``: ``OpenAIResponsesCompactionSession``: ``responses.compact`` once 10 candidate
  items gathered (its default threshold), the whole session sent uncached;
- ``anthropic``: server-side ``clear_tool_uses_20250919`` (trigger 100k of 200k, keep 3) then
  ``compact_20260112`` (trigger 150k of 200k; an extra sampling step over the request, cached);
- ``recap``: production's decision (``core.decision.policy.decide`` after each step, clearings
  at once, summaries written pending) and activation (``core.storage.activation.choose``);
  its summarizer's request as the worker builds it (``core.compression.prefix``): on the chat's
  last request (a cached read when warm) where that shape applies, else its own prompt, then
  the span, priced uncached.

The oracle (``cache_cost_vs_oracle_with_summaries``) keeps Recap's summaries and clearings and
chooses when each summary is first used, knowing every request and gap, by dynamic programming.
"""

from __future__ import annotations

import random

from bench import Figure
from bench import economics_recap as recap_side
from bench.data import load
from bench.economics_peers import MODEL, PEERS, PRICINGS, Bill, Pricing, Run
from recap.core.counting import tokens
from recap.core.decision import policy
from recap.core.decision.cachecost import _Renderer, request_ends, to_msgs

REAL_WINDOW = 8_000
LONG_WINDOW = 64_000
SOURCES = ("swe_agent.jsonl", "openhands.jsonl", "tau_bench_airline.jsonl")
STEP_SECONDS = 10.0
GAP_SECONDS = 600.0


# --- the runs ------------------------------------------------------------------------------------


def real_runs(encoding: str) -> list[Run]:
    runs = []
    for source in SOURCES:
        for index, record in enumerate(load(source)):
            branch = to_msgs(record["messages"], encoding)
            ends = request_ends(branch)
            if not ends:
                continue
            middle = len(ends) // 2
            times = [
                s * STEP_SECONDS + (GAP_SECONDS if s >= middle else 0.0) for s in range(len(ends))
            ]
            runs.append(Run(f"{source}:{index}", branch, ends, times, REAL_WINDOW))
    return runs


WORDS = [f"w{n}" for n in range(400)]


def _text(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def generated_run(seed: int, encoding: str, turns: int = 8) -> Run:
    """A long agent chat: a system prompt, then ``turns`` user turns of 6-16 tool steps each
    (arguments 20-120 words, results 300-4,000), the user back after a gap drawn per turn."""
    rng = random.Random(seed)
    messages: list[dict[str, object]] = [{"role": "system", "content": _text(rng, 600)}]
    for turn in range(turns):
        messages.append({"role": "user", "content": _text(rng, rng.randint(40, 300))})
        for call in range(rng.randint(6, 16)):
            cid = f"call_{turn}_{call}"
            arguments = '{"q": "' + _text(rng, rng.randint(20, 120)) + '"}'
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": cid,
                            "type": "function",
                            "function": {"name": "tool", "arguments": arguments},
                        }
                    ],
                }
            )
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": cid,
                    "content": _text(rng, rng.randint(300, 4_000)),
                }
            )
        messages.append({"role": "assistant", "content": _text(rng, rng.randint(50, 300))})
    branch = to_msgs(messages, encoding)
    ends = request_ends(branch)
    times, now = [], 0.0
    for end in ends:
        previous = branch[end - 1]
        if previous.role == "user":
            roll = rng.random()
            now += (
                rng.uniform(30, 120)
                if roll < 0.6
                else rng.uniform(120, 240)
                if roll < 0.85
                else rng.uniform(360, 3_600)
            )
        else:
            now += STEP_SECONDS
        times.append(now)
    return Run(f"generated:{seed}", branch, ends, times, LONG_WINDOW)


# --- the figures ---------------------------------------------------------------------------------


GENERATED_SEEDS = range(3)


def run() -> list[Figure]:
    encoding = tokens.encoding_name_for(MODEL)
    knobs = policy.Knobs()
    runs = [*real_runs(encoding), *(generated_run(seed, encoding) for seed in GENERATED_SEEDS)]
    figures: list[Figure] = []
    worst = 0.0
    for pricing in PRICINGS:
        bills = {name: Bill() for name in (*PEERS, "recap", "recap_own_shape")}
        oracle_total = 0.0
        for item in runs:
            renderer = _Renderer(encoding)
            for name, strategy in PEERS.items():
                bills[name].merge(strategy(item, pricing, renderer))
            done = recap_side.replay(item, pricing, renderer, knobs, prefix=True)
            bills["recap"].merge(done.bill)
            oracle_total += recap_side.oracle(item, pricing, renderer, done)
            own = recap_side.replay(item, pricing, renderer, knobs)
            bills["recap_own_shape"].merge(own.bill)
        figures.extend(_figures(pricing, bills, oracle_total))
        eligible = [n for n in PEERS if bills[n].over_window == 0] or list(PEERS)
        best = min(eligible, key=lambda n: bills[n].cost)
        worst = max(worst, bills["recap"].cost / bills[best].cost)
    figures.insert(
        0,
        Figure(
            "conversation_cost_vs_best_peer",
            round(worst, 3),
            "<= 0.8",
            "Recap's total over the cheapest peer's that keeps every request within the window, "
            "over the same runs (the shared runs in an 8k window, three generated 64k-window "
            "agent chats), summarizer calls included: the worse of the Anthropic and OpenAI "
            "pricings (each below)",
        ),
    )
    return figures


def _figures(pricing: Pricing, bills: dict[str, Bill], oracle_total: float) -> list[Figure]:
    mine = bills["recap"]
    eligible = [n for n in PEERS if bills[n].over_window == 0] or list(PEERS)
    best = min(eligible, key=lambda n: bills[n].cost)
    peers = ", ".join(
        f"{n} {bills[n].cost / mine.cost:.2f}x ({bills[n].over_window} over the window, "
        f"{bills[n].summary_calls} summarizer calls)"
        for n in PEERS
    )
    name = pricing.name
    out = [
        Figure(
            f"conversation_cost_vs_best_peer_{name}",
            round(mine.cost / bills[best].cost, 3),
            "<= 0.8",
            f"{name} pricing: Recap / {best}; each peer's total over Recap's: {peers}",
        ),
        Figure(
            f"requests_over_window_{name}",
            mine.over_window,
            "== 0",
            f"Recap's requests over the window ({mine.requests} requests, "
            f"{mine.summary_calls} summarizer calls)",
        ),
        Figure(
            f"cache_cost_vs_oracle_with_summaries_{name}",
            round(mine.cost / oracle_total, 3),
            "<= 1.15",
            f"{name} pricing: Recap's total / the least total over every choice of when each of "
            "its summaries is first used (with its clearing batch), knowing every request and gap",
        ),
    ]
    if name == "anthropic":
        share = mine.summary_cached / mine.summary_input if mine.summary_input else 0.0
        own = bills["recap_own_shape"]
        out.append(
            Figure(
                "summary_input_cached_share",
                round(share, 3),
                ">= 0.7",
                "Anthropic pricing: Recap's summarizer calls' input read from the cache / their "
                f"input ({mine.summary_calls} calls), the request built as the worker builds it: "
                "on the chat's last request where that shape applies (the same model, the span "
                "where the request's history begins, the summary it sent the newest written: "
                "core.compression.prefix), else its own prompt then the span",
            )
        )
        out.append(
            Figure(
                "summary_own_shape_cost_vs_on_prefix",
                round(own.cost / mine.cost, 3),
                "",
                "Anthropic pricing: Recap's total with every summarizer request in its own shape "
                "(its prompt, then the span: none of it a cache hit) over its total as built now",
            )
        )
    return out
