"""``recap replay FILE``: what Recap would have done with a team's own conversation logs.

Each conversation of an import-format file is replayed through the real pipeline in a private
SQLite database: messages are added one by one; before each assistant message the request is
assembled as the host would send it, and after each assistant step (its tool results included)
``compress_session`` runs in this process with the configured summarizer. An agent run can be one
user turn with a hundred model calls, so each assistant step counts as a turn for the host. It
also runs before the first request: what arrives before any model call (an imported
conversation, a long first prompt) is history the worker sees too.

Each request carries the fixed parts a live host sends beside the history: the conversation's
tool schemas (a record's ``tools`` when it has them, else a representative set: one schema of a
real schema's size for every tool the conversation calls) and its system prompt (the stored one,
else a representative agent prompt). So the request profile the decision plans with is the one a
host would leave. A request that does not fit is handled as the README's host loop does: compress
now (``workers.compress.compress_now``, the ``Recap.compress`` path) and assemble once more.

``silent_truncations`` counts the requests that left older history out although the run just
before them had decided there was nothing to do: no summary written and none under way, so
nothing will ever cover what was dropped. A run that acts (clears or summarizes) is what keeps
that count at zero.

The prompt-cache price model is the one ``core.decision.cachecost`` uses for the clearing
benchmarks: a request's cached part is its longest prefix of whole messages identical, byte for
byte, to the previous request (nothing is cached across the idle gap); cost = uncached x 1.25 +
cached x 0.1.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select

from recap.core import service
from recap.core.counting import tokens
from recap.core.decision import cachecost as pricing
from recap.core.errors import BudgetError, InputError
from recap.core.request.validate import check_record
from recap.core.settings import Settings
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import CLEARINGS, REQUEST_PROFILES, CompactionLog, table_of, utcnow
from recap.core.storage.sweep import sweep_idle
from recap.core.values import actions
from recap.core.values.request import RequestSpec

KEEP_LAST_BASELINE = 3  # the common default elsewhere: all but the last 3 results, every request
LOG = table_of(CompactionLog)
ACTED = actions.ACTED  # run outcomes that do something about the pressure
REPRESENTATIVE_SYSTEM = (
    "You are an autonomous software agent working in the user's environment. Work step by step: "
    "read the task, inspect the relevant files and state with the tools you have, make the "
    "smallest change that solves the task, then check it (run the tests, reproduce the bug, "
    "confirm the result). Call one tool at a time and read its output before the next call. "
    "Keep identifiers, paths, commands and error messages exactly as they appear. When you are "
    "unsure, look before you act; never invent the output of a tool. When the task is done, say "
    "what you changed and why, and call the tool that ends the run."
)
TOOL_DESCRIPTION_WORDS = (  # about 150 tokens: the prose of a typical agent tool's schema
    "Runs the {name} action in the environment the agent works in and returns what it produced, "
    "as text: the output, or the error message when it failed. Use it when the task needs "
    "{name}; do not guess its result. Arguments are checked before the action runs: a missing "
    "required argument or a value of the wrong type is refused with an error that names it. "
    "Long output is cut to its first and last lines; ask again with narrower arguments for the "
    "part in between. The action runs with the permissions of the agent's workspace, in its "
    "current directory, and its effects persist between calls. Avoid actions that wait for "
    "interactive input, and prefer one precise call over several broad ones. Each call is "
    "logged with its arguments, so repeat a call only when its inputs changed."
)
ARGUMENT_DESCRIPTION = "The {key} to use for this call, exactly as the action expects it."


@dataclass(kw_only=True)
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
    fixed_tokens: int = 0
    tools_from_data: bool = False
    truncations: int = 0
    silent_truncations: int = 0
    compressed_now: int = 0
    over_window_measured: int = 0

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
            "fixed_tokens": self.fixed_tokens,
            "tools_from_data": self.tools_from_data,
            "truncations": self.truncations,
            "silent_truncations": self.silent_truncations,
            "compressed_now": self.compressed_now,
            "over_window_measured": self.over_window_measured,
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


@dataclass(frozen=True)
class HostParts:
    """What a live host sends beside the stored history of one conversation."""

    system: str
    tools: list[dict[str, Any]]
    tools_from_data: bool


def host_parts(
    record: Mapping[str, Any], toolset: Sequence[Mapping[str, Any]] | None = None
) -> HostParts:
    """The record's own tool schemas and system prompt, else representative ones: ``toolset``
    (see ``toolsets``), or a schema for each tool the conversation calls."""
    messages = record["messages"]
    first = messages[0] if messages else {}
    system = first.get("content") if first.get("role") == "system" else None
    if not isinstance(system, str) or not system:
        system = REPRESENTATIVE_SYSTEM
    given = record.get("tools")
    if isinstance(given, list) and given and all(isinstance(t, dict) for t in given):
        return HostParts(system, list(given), True)
    tools = toolset if toolset is not None else representative_tools([record])
    return HostParts(system, [dict(tool) for tool in tools], False)


def toolsets(records: Sequence[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """A representative tool set for each record: a host offers every tool it has on every
    request, not only the ones a conversation happens to call, so the records of one ``source``
    (one host) share the schemas of every tool any of them calls; a record without a source is
    a host of its own."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    keys = []
    for index, record in enumerate(records):
        source = record.get("source")
        key = f"source:{source}" if isinstance(source, str) and source else f"record:{index}"
        groups.setdefault(key, []).append(record)
        keys.append(key)
    schemas = {key: representative_tools(group) for key, group in groups.items()}
    return [schemas[key] for key in keys]


def representative_tools(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One function schema for every tool the records call, each the size of a typical agent
    tool's: a paragraph of description and every argument the calls used, described."""
    arguments: dict[str, dict[str, None]] = {}
    for record in records:
        for message in record["messages"]:
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                name = str(function.get("name") or "")
                if name:
                    keys = arguments.setdefault(name, {})
                    keys.update(dict.fromkeys(_argument_keys(function.get("arguments"))))
    return [_schema(name, list(keys)) for name, keys in arguments.items()]


def _argument_keys(text: Any) -> list[str]:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return []
    return [str(key) for key in value] if isinstance(value, dict) else []


def _schema(name: str, keys: list[str]) -> dict[str, Any]:
    properties = {
        key: {"type": "string", "description": ARGUMENT_DESCRIPTION.format(key=key)} for key in keys
    }
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": TOOL_DESCRIPTION_WORDS.format(name=name),
            "parameters": {"type": "object", "properties": properties, "required": keys},
        },
    }


def assistant_steps(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the messages a model produced (each one a request), the first excluded."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]


@dataclass(frozen=True)
class Host:
    """How the replayed host behaves: what it sends and how its provider counts.

    ``profile_blind`` forgets the request profile before every run, so the decision plans with
    the history alone (the settings' default fixed parts and the stored system prompt), as it
    did before ``assemble`` recorded what the host sends: the figure to compare against.
    ``provider_factor`` stands in for a provider whose tokenizer counts that many times
    tiktoken: each request's prompt tokens are reported back through ``record_usage``.
    """

    fixed_parts: bool = True
    profile_blind: bool = False
    provider_factor: float | None = None


def replay_conversation(
    engine: Any,
    settings: Settings,
    record: Mapping[str, Any],
    *,
    window: int | None,
    idle_gap: bool,
    compress: Callable[[str], Mapping[str, Any]],
    host: Host | None = None,
    toolset: Sequence[Mapping[str, Any]] | None = None,
) -> ConversationReport:
    """Replay one conversation message by message through ingestion, assembly and compression."""
    host = host or Host()
    messages = list(record["messages"])
    cid = service.new_conversation(engine, settings, None, max_input_tokens=window)
    model = settings.default_model
    encoding = tokens.encoding_name_for(model)
    report = ConversationReport(id=str(record.get("id", cid)), messages=len(messages))
    report.window = tokens.context_window(model, window)
    parts = host_parts(record, toolset) if host.fixed_parts else None
    if host.profile_blind:
        compress = _blind(engine, compress)
    request = _Requester(engine, settings, cid, report, _Pricer(encoding), host, parts, compress)
    report.tools_from_data = parts is not None and parts.tools_from_data
    report.fixed_tokens = request.fixed_tokens
    steps = assistant_steps(messages)
    gap_step = len(steps) // 2 if idle_gap and steps else None
    added = 0
    for number, index in enumerate(steps):
        while added < index:
            service.add_message(engine, cid, messages[added])
            added += 1
        action = compress(cid)["action"]
        after_gap = number == gap_step
        if after_gap:
            _idle_gap(engine, settings)
        request(messages[:index], after_gap, action)
    _baselines(messages, encoding, gap_step, report)
    _summary_figures(engine, cid, report)
    return report


def _blind(
    engine: Any, compress: Callable[[str], Mapping[str, Any]]
) -> Callable[[str], Mapping[str, Any]]:
    """``compress`` after forgetting the request profile: the decision plans with history."""

    def run(cid: str) -> Mapping[str, Any]:
        with engine.begin() as connection:
            profiles = REQUEST_PROFILES
            connection.execute(delete(profiles).where(profiles.c.conversation_id == cid))
        return compress(cid)

    return run


class _Requester:
    """Sends one conversation's requests as the README's host loop does, and counts them."""

    def __init__(
        self,
        engine: Any,
        settings: Settings,
        cid: str,
        report: ConversationReport,
        pricer: _Pricer,
        host: Host,
        parts: HostParts | None,
        compress: Callable[[str], Mapping[str, Any]],
    ) -> None:
        self.engine, self.settings, self.cid = engine, settings, cid
        self.report, self.pricer, self.host, self.parts = report, pricer, host, parts
        self.compress = compress
        self.encoding = pricer.encoding
        self.tools = parts.tools if parts is not None else None
        self.tools_tokens = tokens.count_tools(self.tools, self.encoding)
        self.fixed_tokens = self.tools_tokens
        if parts is not None:
            system = {"role": "system", "content": parts.system}
            self.fixed_tokens += tokens.count_message(system, self.encoding)
        self.usage_recorded = False

    def __call__(
        self, sent: Sequence[Mapping[str, Any]], after_gap: bool, action: str | None
    ) -> None:
        report = self.report
        report.requests += 1
        without = tokens.count_messages(sent, self.encoding) + self.tools_tokens
        report.peak_tokens_without = max(report.peak_tokens_without, without)
        report.overflows_without += without > report.window
        try:
            request = self._assemble()
        except BudgetError:  # the host loop: compress now, then retry once
            report.compressed_now += 1
            action = self.compress(self.cid)["action"]
            try:
                request = self._assemble()
            except BudgetError as exc:
                report.errors.append(str(exc))
                return
        total = request.tokens.total
        report.peak_tokens = max(report.peak_tokens, total)
        report.over_window += total > report.window
        if request.truncated:
            report.truncations += 1
            report.silent_truncations += action not in ACTED
        report.cost += self.pricer.price(request.messages, after_gap=after_gap)
        if self.host.provider_factor is not None:
            self._report_usage(request.messages, self.host.provider_factor)

    def _assemble(self) -> Any:
        parts = self.parts
        system = parts.system if parts is not None else None
        request = RequestSpec(system=system, tools=self.tools)
        return service.assemble(self.engine, self.cid, self.settings, request)

    def _report_usage(self, messages: Sequence[Mapping[str, Any]], factor: float) -> None:
        """The stand-in provider: prompt tokens as its tokenizer counts them, recorded."""
        plain = tokens.count_messages(messages, self.encoding) + self.tools_tokens
        measured = math.ceil(plain * factor)
        if self.usage_recorded:  # calibration has had a turn of usage
            self.report.over_window_measured += measured > self.report.window
        service.record_usage(self.engine, self.cid, prompt_tokens=measured)
        self.usage_recorded = True


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
        "truncations": sum(r.truncations for r in reports),
        "silent_truncations": sum(r.silent_truncations for r in reports),
        "compressed_now": sum(r.compressed_now for r in reports),
        "over_window_measured": sum(r.over_window_measured for r in reports),
    }


def run(
    path: Path,
    settings: Settings,
    *,
    window: int | None = None,
    idle_gap: bool = False,
    progress: Callable[[int, int], None] | None = None,
    host: Host | None = None,
) -> dict[str, Any]:
    """Replay every conversation of the file in a private database; the report."""
    if window is not None and window <= 0:
        raise InputError(f"--window must be positive, got {window}")
    records = service.read_import_file(path)
    return replay_records(
        records, settings, window=window, idle_gap=idle_gap, progress=progress, host=host
    )


def replay_records(
    records: Sequence[Mapping[str, Any]],
    settings: Settings,
    *,
    window: int | None = None,
    idle_gap: bool = False,
    progress: Callable[[int, int], None] | None = None,
    host: Host | None = None,
) -> dict[str, Any]:
    """``run`` over records already read (the benchmarks replay the shared data this way)."""
    from recap.workers.compress import compress_now

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
        sets = toolsets(records)
        try:
            for done, (record, toolset) in enumerate(zip(records, sets, strict=True), start=1):
                reports.append(
                    replay_conversation(
                        engine,
                        private,
                        record,
                        window=window,
                        idle_gap=idle_gap,
                        compress=lambda cid: compress_now(engine, private, cid),
                        host=host,
                        toolset=toolset,
                    )
                )
                if progress is not None:
                    progress(done, len(records))
        finally:
            engine.dispose()
    return {"conversations": [r.as_dict() for r in reports], "total": totals(reports)}
