"""Recap's side of ``bench economics``: production's decision after every step and activation
before every request, replayed over one run, and the oracle of activation points.

After each step the compress run decides (``core.decision.policy.decide``) on everything
written, waiting batches included. What it writes is a batch: a summary with the clearings that
follow it (``post_summary_clearing``), or a pressure clearing; ``hold`` says whether a pressure
clearing waits for its activation like a summary (else it applies from the next request). Before
each request the ready batches are used, all together, when ``core.decision.activation.activate``
says so (cold, needed, the saving pays). A request that would still be over the window is
what the host's retry does on a ``BudgetError`` or the provider's overflow error: compress now
(the same decision, before the request) and send again with every batch in use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from bench.economics_peers import (
    INSTRUCTION_TOKENS,
    MODEL,
    SUMMARY_PROMPT_TOKENS,
    Bill,
    Block,
    Meter,
    Pricing,
    Run,
    fitted,
    summary_size,
)
from recap.core.decision import activation as act
from recap.core.decision import policy
from recap.core.decision.cachecost import REPLAY_CLOCK, _Renderer, _state
from recap.core.summaries.planning import replaced_tokens
from recap.core.values.records import ClearingRec, Msg, SummaryRec, merge_step


@dataclass
class Batch:
    """What one compress run wrote: ready from ``ready_at``, used from its activation."""

    ready_at: int
    summary: SummaryRec | None = None
    clearings: list[ClearingRec] = field(default_factory=list)


@dataclass
class RecapRun:
    """Recap's replay: the bill, the batches, the clearings applied at once (with the step they
    apply from) and how many batches were in use at each step."""

    bill: Bill
    batches: list[Batch] = field(default_factory=list)
    at_once: list[tuple[int, ClearingRec]] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    summary_output: float = 0.0


def state(done: RecapRun, step: int, used: int) -> tuple[SummaryRec | None, dict[int, ClearingRec]]:
    """The summary and clearings a request at ``step`` is built from with the first ``used``
    batches in use."""
    clearings: dict[int, ClearingRec] = {}
    records = [rec for at, rec in done.at_once if at <= step]
    summary = None
    for batch in done.batches[:used]:
        records.extend(batch.clearings)
        summary = batch.summary or summary
    for rec in records:
        clearings[rec.message_id] = merge_step(
            clearings.get(rec.message_id),
            rec.message_id,
            rec.reason,
            rec.tokens_reclaimed,
            rec.stage,
            rec.kept_chars,
        )
    return summary, clearings


def blocks_of(
    run: Run,
    renderer: _Renderer,
    end: int,
    summary: SummaryRec | None,
    clearings: dict[int, ClearingRec],
) -> list[Block]:
    """The request for the messages before ``end``: the stored system prompt, the summary, the
    messages after its cutoff as their clearings render them."""
    branch = run.branch[:end]
    blocks: list[Block] = []
    start = 0
    if summary is not None:
        start = 1 + next(i for i, m in enumerate(branch) if m.id == summary.cutoff_message_id)
        if branch[0].role == "system":
            blocks.append((("m", branch[0].id), branch[0].tokens))
        blocks.append((("sum", summary.id), summary.tokens))
    for m in branch[start:]:
        shown = _state(m, clearings)
        blocks.append((("m", m.id, shown), renderer.render(m, shown)[1]))
    return blocks


def tokens_of(blocks: Sequence[Block]) -> int:
    return sum(count for _, count in blocks)


def snapshot(
    run: Run,
    branch: Sequence[Msg],
    summary: SummaryRec | None,
    clearings: dict[int, ClearingRec],
    at: float,
) -> policy.Snapshot:
    return policy.Snapshot(
        conversation_id=run.name,
        model=MODEL,
        window_override=run.window,
        branch=branch,
        summary=summary,
        clearings=clearings,
        profile=None,
        now=REPLAY_CLOCK + timedelta(seconds=at),
    )


def replay(
    run: Run,
    pricing: Pricing,
    renderer: _Renderer,
    knobs: policy.Knobs,
    *,
    hold: bool = True,
    horizon: int = act.DEFAULT_HORIZON,
    prefix: bool = False,
) -> RecapRun:
    """Recap over one run (the module's docstring); with ``prefix`` its summarizer's request is
    the chat's last request and an instruction (``core.summaries.onprefix``) where that shape
    applies: the summary that request sent is the newest written (else its own request)."""
    meter = Meter(pricing, run.window)
    done = RecapRun(meter.bill)
    used, last_at, last_end = 0, None, None
    for step, (end, at) in enumerate(zip(run.ends, run.times, strict=True)):
        ready = sum(1 for b in done.batches if b.ready_at <= step)
        if ready > used:
            now = blocks_of(run, renderer, end, *state(done, step, used))
            later = blocks_of(run, renderer, end, *state(done, step, ready))
            budget = policy.budget_of(snapshot(run, run.branch[:end], None, {}, at), knobs).request
            grown = 0
            if last_end is not None:
                grown = sum(m.tokens for m in run.branch[last_end:end])
            moment = act.Moment(
                rules=pricing.rules,
                idle_seconds=at - last_at if last_at is not None else None,
                without=tokens_of(now),
                with_summary=tokens_of(later),
                budget=budget,
                next_step=grown,
                horizon=horizon,
            )
            if act.activate(moment).use:
                used = ready
        blocks = blocks_of(run, renderer, end, *state(done, step, used))
        if tokens_of(blocks) > run.window:  # the host's retry: compress now, send again
            _decide_after(run, done, step - 1, end - 1, at, knobs, meter, hold=hold)
            used = len(done.batches)
            blocks = blocks_of(run, renderer, end, *state(done, step, used))
        meter.request(blocks, at, newest_result=run.branch[end - 1].role == "tool")
        done.active.append(used)
        last_at, last_end = at, end
        sent = (blocks, used) if prefix else None
        _decide_after(run, done, step, end, at, knobs, meter, hold=hold, sent=sent)
    return done


def _decide_after(
    run: Run,
    done: RecapRun,
    step: int,
    end: int,
    at: float,
    knobs: policy.Knobs,
    meter: Meter,
    *,
    hold: bool,
    sent: tuple[list[Block], int] | None = None,
) -> None:
    """The compress run after the reply at ``end`` is stored: it sees every batch written."""
    branch = run.branch[: end + 1]
    newest, written = state(done, step + 1, len(done.batches))
    decision = policy.decide(snapshot(run, branch, newest, written, at), knobs)
    plan = decision.clear
    pressure = []
    if plan is not None:
        pressure = [
            ClearingRec(
                message_id=i.message_id,
                reason=plan.reason,
                tokens_reclaimed=i.tokens_reclaimed,
                stage=i.stage,
                kept_chars=i.kept_chars,
            )
            for i in plan
        ]
    if decision.action != policy.SUMMARIZE or decision.split is None:
        if pressure and hold:
            done.batches.append(Batch(step + 1, None, pressure))
        else:
            done.at_once.extend((step + 1, rec) for rec in pressure)
        return
    split = decision.split
    clearings = dict(decision.clearings)
    span = replaced_tokens(split.older, clearings)
    previous = newest.tokens if newest is not None else 0
    size = min(summary_size(span + previous, run.window), split.summary_room or 2_000)
    summary = SummaryRec(
        id=len(done.batches) + 1,
        cutoff_message_id=split.cutoff_message_id,
        previous_summary_id=None,
        text="",
        tokens=size,
    )
    in_use = sent is not None and all(b.summary is None for b in done.batches[sent[1] :])
    if sent is not None and in_use:  # the chat's prefix, then the instruction
        meter.summarize(INSTRUCTION_TOKENS, size, on_prefix=sent[0], at=at)
    else:
        meter.summarize(SUMMARY_PROMPT_TOKENS + previous + span, size, on_prefix=None, at=at)
    after = policy.post_summary_clearing(split.recent, clearings, knobs)
    batch = [
        ClearingRec(
            message_id=i.message_id,
            reason=after.reason,
            tokens_reclaimed=i.tokens_reclaimed,
            stage=i.stage,
            kept_chars=i.kept_chars,
        )
        for i in after
    ]
    done.batches.append(Batch(step + 1, summary, pressure + batch))


def oracle(run: Run, pricing: Pricing, renderer: _Renderer, done: RecapRun) -> float:
    """The least cost of Recap's requests over every choice of activation points (batches used
    in order, each from any step after it is ready, never over the window while a choice fits),
    plus Recap's summarizer calls."""
    rules = pricing.rules
    cache: dict[tuple[int, int], list[Block]] = {}
    whole: dict[tuple[int, int], int] = {}

    def blocks(step: int, used: int) -> list[Block]:
        if (step, used) not in cache:
            built = blocks_of(run, renderer, run.ends[step], *state(done, step, used))
            tool_last = run.branch[run.ends[step] - 1].role == "tool"
            cache[step, used] = fitted(built, run.window, newest_result=tool_last)
            whole[step, used] = tokens_of(built)  # what fits is judged before any cut
        return cache[step, used]

    def price(before: list[Block] | None, gap: float, now: list[Block]) -> float:
        hit = 0
        if before is not None and gap < rules.lifetime_seconds:
            for old, new in zip(before, now, strict=False):
                if old != new:
                    break
                hit += new[1]
            hit = hit if hit >= rules.min_prefix_tokens else 0
        return (tokens_of(now) - hit) * rules.write_price + hit * rules.read_price

    best: dict[int, float] = {}
    for step, at in enumerate(run.times):
        ready = sum(1 for b in done.batches if b.ready_at <= step)
        options = range(ready + 1)
        fits = [u for u in options if blocks(step, u) and whole[step, u] <= run.window]
        following: dict[int, float] = {}
        for u in fits or options:
            if step == 0:
                following[u] = price(None, 0.0, blocks(step, u))
                continue
            gap = at - run.times[step - 1]
            costs = [
                so_far + price(blocks(step - 1, before), gap, blocks(step, u))
                for before, so_far in best.items()
                if before <= u
            ]
            if costs:
                following[u] = min(costs)
        best = following or best
    return min(best.values()) + summarizer_cost(run, pricing, renderer, done)


def summarizer_cost(run: Run, pricing: Pricing, renderer: _Renderer, done: RecapRun) -> float:
    """Recap's bill less its requests priced again: its summarizer calls."""
    meter = Meter(pricing, run.window)
    for step, at in enumerate(run.times):
        end = run.ends[step]
        meter.request(
            blocks_of(run, renderer, end, *state(done, step, done.active[step])),
            at,
            newest_result=run.branch[end - 1].role == "tool",
        )
    return done.bill.cost - meter.bill.cost
