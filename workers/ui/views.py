"""What the console's pages show, read from the database with the functions the CLI uses.

Reads only: the conversations list (``core.service.console``, paginated in the database, with
``core.service.conversation_stats`` for the rows of the page), and one conversation's page (the
stats, the branch, the request as ``core.request.assembly.assemble`` builds it now and, when asked,
as ``core.service.assemble`` builds it as of a chosen time, the compaction log, the provider
readings and the branches). Nothing here writes: the requests are assembled without recording a
request profile or a clearing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr
from sqlalchemy import Engine

from recap.core import service
from recap.core.counting import budget as budgets
from recap.core.counting import tokens
from recap.core.errors import InputError, RecapError
from recap.core.redact import known_secrets, redact
from recap.core.request import assembly
from recap.core.results import Stats
from recap.core.service import assembling, console
from recap.core.service.console import ConversationRead
from recap.core.settings import Settings
from recap.core.values.actions import Action
from recap.core.values.console import ConversationRow, PressureInputs, Run
from recap.core.values.profile import Profile
from recap.core.values.records import Msg, SummaryRec
from recap.core.values.request import RequestSpec
from recap.workers.serve.auth import fingerprint
from recap.workers.ui import chart
from recap.workers.ui.bar import Bar, token_bar
from recap.workers.ui.timeline import Item, timeline

LIBRARY_OWNER = "library / CLI"  # conversations created without a serve key
REQUEST_JSON_CHARS = 1_000_000  # the request as sent is shown up to this size


@dataclass(frozen=True)
class Scope:
    """Whose conversations a console session sees: all of them (a UI key, the operator), or
    those one serve client key created."""

    operator: bool
    owner: str | None = None  # the client key's fingerprint

    def may_see(self, owner: str | None) -> bool:
        return self.operator or (owner is not None and owner == self.owner)


def owner_labels(keys: Sequence[SecretStr]) -> dict[str, str]:
    """A label for the fingerprint of each configured client key: its place in
    RECAP_SERVE_KEYS and the start of its fingerprint (never the key)."""
    labels = {}
    for index, key in enumerate(keys, start=1):
        mark = fingerprint(key.get_secret_value())
        labels[mark] = f"key {index} · {mark[:8]}"
    return labels


def owner_label(owner: str | None, labels: Mapping[str, str]) -> str:
    if owner is None:
        return LIBRARY_OWNER
    return labels.get(owner, f"other key · {owner[:8]}")


# --- the list -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListRow:
    row: ConversationRow
    owner: str
    stats: Stats | None
    problem: str | None = None


@dataclass(frozen=True, kw_only=True)
class ListView:
    rows: list[ListRow]
    total: int
    page: int
    pages: int
    search: str
    sort: str
    descending: bool


def list_view(
    engine: Engine,
    settings: Settings,
    scope: Scope,
    *,
    search: str,
    sort: str,
    descending: bool,
    page: int,
    page_size: int,
) -> ListView:
    """One page of the conversations list, each row with its stats."""
    found = console.list_conversations(
        engine,
        search=search,
        owner=scope.owner,
        scoped=not scope.operator,
        sort=sort,
        descending=descending,
        limit=page_size,
        offset=(page - 1) * page_size,
        pressure=pressure_inputs(settings),
    )
    labels = owner_labels(settings.serve_keys)
    rows = []
    for row in found.rows:
        try:
            stats: Stats | None = service.conversation_stats(engine, row.id, settings)
            problem = None
        except RecapError as exc:  # an unknown model, say: the row still lists
            stats, problem = None, str(exc)
        rows.append(ListRow(row, owner_label(row.owner, labels), stats, problem))
    pages = max(1, -(-found.total // page_size))
    return ListView(
        rows=rows,
        total=found.total,
        page=page,
        pages=pages,
        search=search,
        sort=sort,
        descending=descending,
    )


def pressure_inputs(settings: Settings) -> PressureInputs:
    """What the list's pressure sort needs: each model's window and output reserve from the
    model map (as ``core.counting.budget`` reads them), and the budget's settings."""

    def window_of(model: str) -> tuple[int, int] | None:
        try:
            window = tokens.context_window(model)
        except (RecapError, ValueError):  # an unknown model: its conversations sort last
            return None
        reserve = budgets.output_reserve(
            tokens.model_info(model),
            window_given=False,
            setting=settings.reserve_output_tokens,
        )
        return window, reserve

    return PressureInputs(
        window_of=window_of,
        safety_margin=settings.safety_margin,
        default_fixed_tokens=settings.default_fixed_tokens,
        priming_tokens=tokens.TOKENS_REPLY_PRIMING,
    )


# --- one conversation -----------------------------------------------------------------------------


@dataclass(kw_only=True)
class ConversationView:
    id: str
    owner: str
    model: str
    leaf: int | None
    stats: Stats
    bar: Bar
    items: list[Item]
    summaries: list[SummaryRec]
    runs: list[Run]
    branches: list[tuple[int, datetime | None]]
    chart: dict[str, Any]
    request: assembly.AssembledRequest | None
    request_json: str
    request_problem: str | None
    held_back: int  # tokens of the host's fixed parts the preview leaves room for
    latest_failed: bool
    summary_in_effect: int | None
    clearings: int = 0  # messages of the branch with a clearing
    pinned: int = 0  # pinned messages on the branch
    as_of: AsOfView | None = None  # the request as of a chosen time, when one was asked for
    leaf_given: int | None = None  # the branch named in the address (else the latest)
    merges: list[dict[str, Any]] = field(default_factory=list)  # each commit and its parents


@dataclass(frozen=True, kw_only=True)
class AsOfView:
    """The request as it would have been built at a chosen time (``recap assemble --as-of``),
    or why there is none: a time that does not read as one (``bad_input``), or a time before
    the conversation's first message."""

    text: str  # the time as given
    moment: datetime | None
    request: assembly.AssembledRequest | None
    request_json: str
    problem: str | None
    bad_input: bool = False


def conversation_owner(engine: Engine, conversation_id: str) -> tuple[bool, str | None]:
    """Whether the conversation exists, and its owner's fingerprint."""
    return console.conversation_owner(engine, conversation_id)


def has_message(engine: Engine, conversation_id: str, message_id: int) -> bool:
    """Whether ``message_id`` is one of the conversation's messages."""
    return console.has_message(engine, conversation_id, message_id)


def conversation_view(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf: int | None,
    as_of: str | None = None,
) -> ConversationView:
    """Everything one conversation's page shows, for the branch ending at ``leaf``; with
    ``as_of`` (a time as typed), the request as of that time too."""
    read = console.read_conversation(engine, conversation_id, leaf, settings)
    stats = service.conversation_stats(engine, conversation_id, settings, leaf)
    held_back = _held_back(read.loaded.branch, read.profile)
    request, problem = None, None
    try:
        request = preview_request(read, settings, leaf, held_back)
    except RecapError as exc:  # the tail does not fit, say: the page still shows the rest
        problem = str(exc)
    summary = read.loaded.summary
    bar = token_bar(
        stats,
        parts=read.profile.parts if read.profile is not None else None,
        summary_tokens=summary.tokens if summary is not None else 0,
        media_tokens=request.tokens.media if request is not None else 0,
        reasoning_tokens=request.tokens.reasoning if request is not None else 0,
        safety_margin=settings.safety_margin,
        urgent_ratio=settings.urgent_ratio,
    )
    in_effect = summary.id if summary is not None else None
    shown = read.expanded or read.loaded
    items = timeline(
        shown.branch,
        summaries=read.summaries,
        summary_in_effect=in_effect,
        clearings=shown.clearings,
        dropped=request.dropped_message_ids if request is not None else (),
        created=read.created,
        pinned=[m.id for m in shown.pinned],
        provenance=read.provenance,
    )
    secrets = known_secrets(settings)
    past = None
    if as_of is not None:
        past = as_of_view(engine, settings, conversation_id, leaf, as_of, held_back, secrets)
    runs = [_masked_run(run, secrets) for run in read.runs]
    return ConversationView(
        id=conversation_id,
        owner=owner_label(read.owner, owner_labels(settings.serve_keys)),
        model=read.model,
        leaf=read.loaded.branch[-1].id if read.loaded.branch else None,
        stats=stats,
        bar=bar,
        items=items,
        summaries=read.summaries,
        runs=runs,
        branches=read.branches,
        chart=request_series(read, stats),
        request=request,
        request_json=_request_json(request, secrets),
        request_problem=problem,
        held_back=held_back,
        latest_failed=bool(runs) and runs[0].action == Action.FAILED,
        summary_in_effect=in_effect,
        clearings=sum(1 for m in read.loaded.branch if m.id in read.loaded.clearings),
        pinned=len(read.loaded.pinned),
        as_of=past,
        leaf_given=leaf,
        merges=read.merges,
    )


TIME_CHARS_MAX = 64  # an ISO 8601 time is well under this


def parse_time(text: str) -> datetime:
    """A time as typed on the page: ISO 8601 (``2025-06-01``, ``2025-06-01T12:30:00Z``, a
    browser's ``2025-06-01T12:30``), UTC unless it names an offset; else an ``InputError``."""
    cleaned = text.strip()
    try:
        if len(cleaned) > TIME_CHARS_MAX:
            raise ValueError
        moment = datetime.fromisoformat(cleaned)
    except ValueError:
        shown = cleaned[:TIME_CHARS_MAX] + ("…" if len(cleaned) > TIME_CHARS_MAX else "")
        raise InputError(
            f"{shown!r} is not a time: use ISO 8601, such as 2025-06-01T12:30:00Z (UTC unless "
            "an offset is given)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def as_of_view(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf: int | None,
    text: str,
    held_back: int,
    secrets: list[str],
) -> AsOfView:
    """The request ``recap assemble --as-of`` builds (only the summaries, clearings and pins
    recorded by then; the branch head then unless ``leaf`` is given), with the same room held
    back for the host's parts as the request now; nothing is recorded."""
    try:
        moment = parse_time(text)
    except InputError as exc:
        return AsOfView(
            text=text, moment=None, request=None, request_json="", problem=str(exc), bad_input=True
        )
    try:
        request = service.assemble(
            engine,
            conversation_id,
            settings,
            RequestSpec(as_of=moment),
            leaf=leaf,
            record=False,
            reserve_tokens=held_back,
        )
    except RecapError as exc:  # no message by then, or its tail did not fit: said, not raised
        return AsOfView(text=text, moment=moment, request=None, request_json="", problem=str(exc))
    return AsOfView(
        text=text,
        moment=moment,
        request=request,
        request_json=_request_json(request, secrets),
        problem=None,
    )


def _masked_run(run: Run, secrets: list[str]) -> Run:
    """A log row with its reason and error masked once more (they are stored masked)."""
    return replace(
        run,
        reason=redact(run.reason, secrets),
        error=redact(run.error, secrets) if run.error is not None else None,
    )


def _request_json(request: assembly.AssembledRequest | None, secrets: list[str]) -> str:
    if request is None:
        return ""
    text = json.dumps(request.messages, indent=2, ensure_ascii=False)
    for secret in secrets:
        text = text.replace(secret, "***")
    if len(text) > REQUEST_JSON_CHARS:
        return text[:REQUEST_JSON_CHARS] + "\n… (cut here: the request is longer)"
    return text


def _held_back(branch: Sequence[Msg], profile: Profile | None) -> int:
    """Tokens of the fixed parts the host last sent that the stored branch cannot show (their
    text is not stored): its tools, reminder and context files, and its own system prompt when it
    sent one instead of the stored root prompt."""
    if profile is None or profile.parts is None:
        return 0
    parts = profile.parts
    root = assembly.stored_prompt(branch)
    system = 0 if root is not None and parts.system == root.tokens else parts.system
    return system + parts.tools + parts.reminder + parts.context


def preview_request(
    read: ConversationRead, settings: Settings, leaf: int | None, held_back: int
) -> assembly.AssembledRequest:
    """The request ``recap assemble`` would build now from the stored branch, with room held
    back for the host's own fixed parts; nothing is recorded."""
    window = tokens.context_window(read.model, read.window_override)
    limit = assembling.request_budget(  # as the request itself is planned (the timeline too)
        settings,
        read.model,
        window,
        read.window_override is not None,
        read.profile,
        leaf,
        service.utcnow(),
    ).request
    loaded = read.expanded or read.loaded  # attachments expanded, as a request has them
    stored = assembly.StoredBranch(
        branch=loaded.branch,
        summary=loaded.summary,
        clearings=loaded.clearings,
        pinned=loaded.pinned,
        missing_outputs=console.missing_outputs(loaded, settings),
    )
    target = assembly.Target(
        model=read.model,
        window=window,
        safety_margin=settings.safety_margin,
        budget=max(limit - held_back, 1),
        media_policy=service.media_policy(settings),
        thinking_turns=settings.thinking_turns,
    )
    return assembly.assemble(stored, target=target)


def request_series(read: ConversationRead, stats: Stats) -> dict[str, Any]:
    """The data of the request-tokens chart (``workers.ui.chart``)."""
    history = chart.History(
        branch=read.loaded.branch,
        created=read.created,
        summaries=read.summaries,
        clearings=read.loaded.clearings,
        cleared_at=read.cleared_at,
        has_root_prompt=assembly.stored_prompt(read.loaded.branch) is not None,
    )
    return chart.request_series(
        history,
        fixed=stats.fixed,
        calibration=stats.calibration,
        readings=[(r.leaf_message_id, r.prompt_tokens) for r in read.readings],
        next_request=stats.used,
        window=stats.window,
    )
