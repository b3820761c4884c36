"""``recap replay FILE``: what Recap would have done with a team's own conversation logs.

Each conversation of an import-format file is replayed through the real pipeline in a private
SQLite database: messages are added one by one; before each assistant message the request is
assembled as the host would send it, and after each assistant step (its tool results included)
``compress_session`` runs in this process with the configured summarizer. An agent run can be one
user turn with a hundred model calls, so each assistant step counts as a turn for the host.

The prompt-cache price model is the one ``core.replay`` uses for the clearing benchmarks: a
request's cached part is its longest prefix of whole messages identical, byte for byte, to the
previous request (nothing is cached across the idle gap); cost = uncached x 1.25 + cached x 0.1.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from core import replay as pricing
from core import service, tokens
from core.db import make_engine
from core.errors import BudgetError, InputError
from core.migrate import upgrade
from core.models import CLEARINGS, CompactionLog, table_of, utcnow
from core.settings import Settings
from core.sweep import sweep_idle
from core.validate import check_record

KEEP_LAST_BASELINE = 3  # the common default elsewhere: all but the last 3 results, every request
LOG = table_of(CompactionLog)


@dataclass
class ConversationReport:
    """What Recap would have done with one conversation."""

    id: str
    messages: int
    requests: int = 0
    window: int = 0
    peak_tokens: int = 0
    peak_tokens_without: int = 0
    over_window: int = 0
    overflows_without: int = 0
    errors: list[str] = field(default_factory=list)
    summaries: int = 0
    clearings: int = 0
    summarizer_tokens: int = 0
    cost: float = 0.0
    cost_no_clearing: float = 0.0
    cost_sliding: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "messages": self.messages,
            "requests": self.requests,
            "window": self.window,
            "peak_tokens": self.peak_tokens,
            "peak_tokens_without": self.peak_tokens_without,
            "over_window": self.over_window,
            "overflows_without": self.overflows_without,
            "errors": self.errors,
            "summaries": self.summaries,
            "clearings": self.clearings,
            "summarizer_tokens": self.summarizer_tokens,
            "cost_vs_no_clearing": _ratio(self.cost, self.cost_no_clearing),
            "cost_vs_sliding": _ratio(self.cost, self.cost_sliding),
        }


def _ratio(value: float, base: float) -> float:
    return round(value / base, 4) if base else 1.0


class _Pricer:
    """Prices consecutive requests of one conversation by their shared message prefix."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.previous: list[str] = []
        self.counts: dict[str, int] = {}

    def price(self, messages: Sequence[Mapping[str, Any]], *, after_gap: bool) -> float:
        texts = [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in messages]
        counts = [self._count(text, m) for text, m in zip(texts, messages, strict=True)]
        cost, _, _ = pricing.priced(self.previous, texts, counts, after_gap=after_gap)
        self.previous = texts
        return cost

    def _count(self, text: str, message: Mapping[str, Any]) -> int:
        if text not in self.counts:
            self.counts[text] = tokens.count_message(message, self.encoding)
        return self.counts[text]


def assistant_steps(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the messages a model produced (each one a request), the first excluded."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]


def replay_conversation(
    engine: Any,
    settings: Settings,
    record: Mapping[str, Any],
    *,
    window: int | None,
    idle_gap: bool,
    compress: Callable[[str], dict[str, Any]],
) -> ConversationReport:
    """Replay one conversation message by message through ingestion, assembly and compression."""
    messages = list(record["messages"])
    cid = service.new_conversation(engine, settings, None, max_input_tokens=window)
    model = settings.default_model
    encoding = tokens.encoding_name_for(model)
    report = ConversationReport(id=str(record.get("id", cid)), messages=len(messages))
    report.window = tokens.context_window(model, window)
    steps = assistant_steps(messages)
    gap_step = len(steps) // 2 if idle_gap and steps else None
    pricer = _Pricer(encoding)
    added = 0
    for number, index in enumerate(steps):
        while added < index:
            service.add_message(engine, cid, messages[added])
            added += 1
        if number:
            compress(cid)
        after_gap = number == gap_step
        if after_gap:
            _idle_gap(engine, settings)
        _request(engine, settings, cid, messages[:index], report, pricer, after_gap, encoding)
    _baselines(messages, encoding, gap_step, report)
    _summary_figures(engine, cid, report)
    return report


def _request(
    engine: Any,
    settings: Settings,
    cid: str,
    sent: Sequence[Mapping[str, Any]],
    report: ConversationReport,
    pricer: _Pricer,
    after_gap: bool,
    encoding: str,
) -> None:
    report.requests += 1
    without = tokens.count_messages(sent, encoding)
    report.peak_tokens_without = max(report.peak_tokens_without, without)
    report.overflows_without += without > report.window
    try:
        request = service.assemble(engine, cid, settings)
    except BudgetError as exc:
        report.errors.append(str(exc))
        return
    total = request.tokens.total
    report.peak_tokens = max(report.peak_tokens, total)
    report.over_window += total > report.window
    report.cost += pricer.price(request.messages, after_gap=after_gap)


def _idle_gap(engine: Any, settings: Settings) -> None:
    """Time passes beyond the idle setting: the beat sweep clears what it would clear."""
    later = utcnow() + timedelta(minutes=settings.idle_minutes + 1)
    sweep_idle(engine, settings, now=later)


def _baselines(
    messages: Sequence[Mapping[str, Any]],
    encoding: str,
    gap: int | None,
    report: ConversationReport,
) -> None:
    branch = pricing.to_msgs(messages, encoding)
    never = pricing.replay(branch, pricing.never, encoding=encoding, gap_at=gap)
    sliding = pricing.replay(
        branch, pricing.keep_last_every_request(KEEP_LAST_BASELINE), encoding=encoding, gap_at=gap
    )
    report.cost_no_clearing, report.cost_sliding = never.cost, sliding.cost


def _summary_figures(engine: Any, cid: str, report: ConversationReport) -> None:
    report.summaries = len(service.list_summaries(engine, cid))
    with engine.connect() as connection:
        report.summarizer_tokens = int(
            connection.execute(
                select(func.coalesce(func.sum(LOG.c.input_tokens), 0)).where(
                    LOG.c.conversation_id == cid
                )
            ).scalar_one()
        )
        report.clearings = int(
            connection.execute(
                select(func.count()).where(CLEARINGS.c.conversation_id == cid)
            ).scalar_one()
        )


def totals(reports: Sequence[ConversationReport]) -> dict[str, Any]:
    """The contract's ``total`` object over every conversation."""
    cost = sum(r.cost for r in reports)
    return {
        "conversations": len(reports),
        "requests": sum(r.requests for r in reports),
        "peak_tokens": max((r.peak_tokens for r in reports), default=0),
        "over_window": sum(r.over_window for r in reports),
        "overflows_without": sum(r.overflows_without for r in reports),
        "errors": sum(len(r.errors) for r in reports),
        "summaries": sum(r.summaries for r in reports),
        "clearings": sum(r.clearings for r in reports),
        "summarizer_tokens": sum(r.summarizer_tokens for r in reports),
        "cost_vs_no_clearing": _ratio(cost, sum(r.cost_no_clearing for r in reports)),
        "cost_vs_sliding": _ratio(cost, sum(r.cost_sliding for r in reports)),
    }


def run(
    path: Path,
    settings: Settings,
    *,
    window: int | None = None,
    idle_gap: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Replay every conversation of the file in a private database; the report."""
    from workers.compress import run_with_retries

    if window is not None and window <= 0:
        raise InputError(f"--window must be positive, got {window}")
    records = service.read_import_file(path)
    for index, record in enumerate(records):
        check_record(record, f"conversation {index + 1}")
    reports: list[ConversationReport] = []
    with tempfile.TemporaryDirectory(prefix="recap-replay-") as folder:
        private = settings.model_copy(
            update={
                "database_url": f"sqlite:///{Path(folder) / 'replay.db'}",
                "output_dir": Path(folder) / "outputs",
            }
        )
        engine = make_engine(private.database_url)
        upgrade(engine)
        try:
            for done, record in enumerate(records, start=1):
                reports.append(
                    replay_conversation(
                        engine,
                        private,
                        record,
                        window=window,
                        idle_gap=idle_gap,
                        compress=lambda cid: run_with_retries(engine, private, cid),
                    )
                )
                if progress is not None:
                    progress(done, len(records))
        finally:
            engine.dispose()
    return {"conversations": [r.as_dict() for r in reports], "total": totals(reports)}
