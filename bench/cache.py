"""Prompt-cache cost of clearing policies, replayed over the shared agent runs.

Each SWE-agent, OpenHands and tau-bench run is replayed one request per assistant step with one
idle gap (longer than ``RECAP_IDLE_MINUTES``) before its middle step (``core.decision.cachecost``).
Three policies: never clearing; clearing all but the last 3 tool results before every request (the
common default elsewhere); and Recap's production decision (``core.decision.policy``: the idle
sweep's clearing after the gap, ``decide``'s pressure step otherwise), with its aged stage on (the
default) and off (``RECAP_AGED_RESULT_CHARS=0``: clearing only). Against the limit too: the
cheapest clearing schedule of each run with production's floors, computed offline knowing every
request and the gap (``core.decision.cachecost.oracle``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench import Figure
from bench.data import load
from recap.core.counting import tokens
from recap.core.decision.cachecost import (
    RunCost,
    keep_last_every_request,
    middle_step,
    never,
    oracle_cost,
    recap_policy,
    replay,
    to_msgs,
)
from recap.core.decision.policy import Knobs
from recap.core.settings import load_settings

MODEL = "gpt-4o-mini"
SOURCES = {
    "swe_agent": "swe_agent.jsonl",
    "openhands": "openhands.jsonl",
    "tau_bench": "tau_bench_airline.jsonl",
}
BASELINE_KEEP = 3  # what the common default keeps
ORACLE_BOUND = "<= 1.15"  # Recap's policy within 15% of the best any schedule could do
SMALL_WINDOW = 16_000  # a window the longer runs outgrow: the pressure steps (age, clear) happen


@dataclass
class Totals:
    """One source's totals under each policy."""

    never: float = 0.0
    keep3: float = 0.0
    recap: float = 0.0  # the production decision, aged stage on
    oracle: float = 0.0
    after_gap_never: int = 0
    after_gap_recap: int = 0
    clearing_only: float = 0.0  # the production decision with the aged stage off
    tokens_recap: int = 0  # request tokens of every replayed request, aged stage on
    tokens_clearing_only: int = 0  # the same, aged stage off
    aged: int = 0  # results the runs end with aged
    aged_steps: int = 0  # results aged along the runs
    argument_steps: int = 0  # old calls' arguments shortened along the runs

    def add(self, runs: dict[str, RunCost], oracle: float) -> None:
        self.never += runs["never"].cost
        self.keep3 += runs["keep3"].cost
        self.recap += runs["recap"].cost
        self.oracle += oracle
        self.after_gap_never += runs["never"].tokens_after_gap
        self.after_gap_recap += runs["recap"].tokens_after_gap
        self.clearing_only += runs["clearing_only"].cost
        self.tokens_recap += runs["recap"].tokens
        self.tokens_clearing_only += runs["clearing_only"].tokens
        self.aged += runs["recap"].aged
        self.aged_steps += runs["recap"].aged_steps
        self.argument_steps += runs["recap"].argument_steps

    def merge(self, other: Totals) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def vs_best(self) -> float:
        return self.recap / min(self.never, self.keep3)

    @property
    def vs_oracle(self) -> float:
        return self.recap / self.oracle


def replay_source(name: str, idle_keep: int | None = None, window: int | None = None) -> Totals:
    """Replay every run of one source file under the policies (``idle_keep`` overrides how many
    results Recap keeps at the idle gap, ``window`` the model's own window)."""
    settings = load_settings()
    encoding = tokens.encoding_name_for(MODEL)
    knobs = Knobs.from_settings(settings)
    if idle_keep is not None:
        knobs = replace(knobs, idle_keep_tool_results=idle_keep)
    policies = {
        "never": never,
        "keep3": keep_last_every_request(BASELINE_KEEP),
        "recap": recap_policy(knobs, model=MODEL, window=window),  # the production decision
        "clearing_only": recap_policy(
            replace(knobs, aged_result_chars=0), model=MODEL, window=window
        ),
    }
    totals = Totals()
    for record in load(name):
        branch = to_msgs(record["messages"], encoding)
        gap = middle_step(branch)
        runs = {
            key: replay(branch, policy, encoding=encoding, gap_at=gap)
            for key, policy in policies.items()
        }
        totals.add(runs, oracle_cost(branch, knobs, encoding=encoding, gap_at=gap).cost)
    return totals


def run() -> list[Figure]:
    settings = load_settings()
    overall = Totals()
    figures: list[Figure] = []
    for source, name in SOURCES.items():
        totals = replay_source(name)
        overall.merge(totals)
        figures.append(
            Figure(
                f"cache_cost_vs_best_baseline_{source}",
                round(totals.vs_best, 3),
                "<= 1",
                f"{source}: cost under Recap's policy / the cheaper of never clearing and "
                f"clearing all but the last 3 results before every request "
                f"(keep-3 / never = {totals.keep3 / totals.never:.3f})",
            )
        )
        figures.append(
            Figure(
                f"cache_cost_vs_oracle_{source}",
                round(totals.vs_oracle, 3),
                ORACLE_BOUND,
                f"{source}: cost under Recap's policy / the least cost of any clearing schedule "
                "with the same floors, knowing every request and the gap "
                "(core.decision.cachecost.oracle)",
            )
        )
    figures.insert(
        0,
        Figure(
            "cache_cost_vs_best_baseline",
            round(overall.vs_best, 3),
            "<= 0.9",
            "all three sources: prompt-cache cost (uncached x 1.25 + cached x 0.1) under Recap's "
            "policy / the cheaper baseline, one request per assistant step, idle gap mid-run "
            f"(keep-3 / never = {overall.keep3 / overall.never:.3f})",
        ),
    )
    figures.insert(
        1,
        Figure(
            "cache_cost_vs_oracle",
            round(overall.vs_oracle, 3),
            ORACLE_BOUND,
            "all three sources: prompt-cache cost under Recap's policy (its aged stage on, the "
            "default) / under the offline limit: "
            "the cheapest schedule of clearing points, found exactly by dynamic programming over "
            "each run's steps, that clears the oldest results worth clearing and keeps the last "
            f"{settings.keep_tool_results} ({settings.idle_keep_tool_results} at the first "
            "request after the gap), as production does",
        ),
    )
    figures.insert(
        2,
        Figure(
            "cache_cost_vs_oracle_without_ageing",
            round(overall.clearing_only / overall.oracle, 3),
            ORACLE_BOUND,
            "the same with the aged stage off (RECAP_AGED_RESULT_CHARS=0: results go straight "
            "from full to cleared, arguments stay whole)",
        ),
    )
    figures.append(
        Figure(
            "aged_request_tokens_vs_cleared_only",
            round(overall.tokens_recap / overall.tokens_clearing_only, 3),
            "",
            "all three sources: request tokens of every replayed request with the aged stage "
            f"on / off, the model's own window ({overall.aged_steps} results aged, "
            f"{overall.argument_steps} calls' arguments shortened: the runs stay under the "
            "trigger but for the idle gap, which clears)",
        )
    )
    small = Totals()
    for name in SOURCES.values():
        small.merge(replay_source(name, window=SMALL_WINDOW))
    figures.append(
        Figure(
            "aged_request_tokens_vs_cleared_only_small_window",
            round(small.tokens_recap / small.tokens_clearing_only, 3),
            "",
            f"the same in a {SMALL_WINDOW:,}-token window, where pressure steps happen "
            f"({small.aged_steps} results aged, {small.aged} still aged at the end, "
            f"{small.argument_steps} calls' arguments shortened; cost with / without ageing = "
            f"{small.recap / small.clearing_only:.3f}, vs the oracle "
            f"{small.recap / small.oracle:.3f} / {small.clearing_only / small.oracle:.3f})",
        )
    )
    variant = Totals()
    for name in SOURCES.values():
        variant.merge(replay_source(name, idle_keep=settings.keep_tool_results))
    figures.append(
        Figure(
            "cache_cost_vs_best_baseline_idle_keep_3",
            round(variant.vs_best, 3),
            "",
            "the same with the idle sweep keeping the last 3 results (RECAP_IDLE_KEEP_TOOL_RESULTS"
            "=3) instead of the default 1",
        )
    )
    figures.append(
        Figure(
            "post_idle_tokens_vs_no_clearing",
            round(overall.after_gap_recap / overall.after_gap_never, 3),
            "<= 0.9",
            "request tokens from the idle gap on, Recap's policy / never clearing",
        )
    )
    return figures
