"""Every conversation of the test data, assembled from SQLite at three windows: a valid request
or one clear budget error, never a traceback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from recap.core import service
from recap.core.counting import tokens
from recap.core.errors import BudgetError
from recap.core.request.assembly import AssembledRequest
from recap.core.request.placeholders import cleared_placeholder
from recap.core.request.shorten import SHORTENED
from recap.core.settings import Settings, load_settings
from recap.core.storage import reads
from recap.core.storage.db import make_engine, session_scope
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import Clearing, Summary, utcnow
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from tests.support.assembling import assemble
from tests.support.data import DATA_FILES, load_data
from tests.test_assembly import check_request

WINDOWS = (3_000, 12_000, 60_000)
REMINDER = "Reminder: keep the changes minimal and run the tests."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
# Share of conversations that must assemble (not raise) at each window: a floor that catches a
# regression that turns valid requests into errors. Agent runs with one long user turn cannot fit
# a small window without a summary, which is what compression is for.
MIN_VALID_SHARE = {3_000: 0.85, 12_000: 0.95, 60_000: 1.0}
KEEP_UNCLEARED = 3  # the newest tool results keep their output in the summarized copy


@pytest.fixture(scope="module")
def data_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A SQLite file holding every conversation of the test data, imported once."""
    path = tmp_path_factory.mktemp("assembly") / "data.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    records = [record for name in DATA_FILES for record in load_data(name)]
    service.import_conversations(engine, records, load_settings())
    engine.dispose()
    yield path


def _engine(path: Path) -> Engine:
    return make_engine(f"sqlite:///{path}")


def _ids(engine: Engine) -> list[str]:
    with session_scope(engine) as session:
        return [
            str(row[0])
            for row in session.connection().exec_driver_sql(
                "SELECT id FROM conversations ORDER BY id"
            )
        ]


def _check_against_branch(request: AssembledRequest, state: reads.RequestBranch) -> None:
    """System first, reminder last, the last user message sent, and after it the newest step;
    older steps of the turn only when they fit (else left out and reported, oldest first)."""
    check_request(request)
    branch = state.branch
    if branch and branch[0].role == "system":
        assert request.messages[0] == branch[0].to_openai()
    assert request.messages[-1] == {"role": "user", "content": REMINDER}
    cutoff_ids = {m.id for m in branch}
    if state.summary is not None:
        position = [m.id for m in branch].index(state.summary.cutoff_message_id)
        cutoff_ids = {m.id for m in branch[position + 1 :]}
    users = [m for m in branch if m.role == "user" and m.id in cutoff_ids]
    if users:
        assert users[-1].to_openai() in request.messages
    sent_after = [m for m in branch if m.id in cutoff_ids and m.id > (users[-1].id if users else 0)]
    dropped = set(request.dropped_message_ids)
    steps = [m.id for m in sent_after if m.role != "tool"]
    cut = [mid for mid in steps if mid in dropped]
    # Steps of the turn are left out only to fit, reported, the oldest first, never the newest.
    assert cut == steps[: len(cut)] and (not cut or request.truncated)


def _assemble_all(engine: Engine, settings: Settings, window: int, **knobs: Any) -> int:
    """Assemble every conversation; returns how many gave a request (the rest a budget error)."""
    valid = 0
    for cid in _ids(engine):
        with session_scope(engine) as session:
            state = reads.load_whole_branch(session, cid)
        try:
            request = service.assemble(
                engine, cid, settings, max_input_tokens=window, reminder=REMINDER, **knobs
            )
        except BudgetError as exc:
            text = str(exc)
            assert "\n" not in text and "last user message" in text
            assert f"window {window}" in text
            continue
        assert request.tokens.total <= request.budget <= window
        _check_against_branch(request, state)
        valid += 1
    return valid


@pytest.mark.parametrize("window", WINDOWS)
def test_every_conversation_at_window(data_db: Path, settings: Settings, window: int) -> None:
    """Each conversation gives a valid request or a clear budget error at this window."""
    engine = _engine(data_db)
    valid = _assemble_all(engine, settings, window, tools=TOOLS)
    engine.dispose()
    assert valid >= MIN_VALID_SHARE[window] * 244, f"only {valid} of 244 fit {window} tokens"


def _same_as_whole_branch(engine: Engine, settings: Settings, window: int) -> int:
    """Requests read partly (``core.storage.reads``) equal those from the whole stored branch;
    returns how many left messages unread."""
    knobs: dict[str, Any] = {"reminder": REMINDER, "tools": TOOLS}
    return sum(
        check_partial_read(engine, settings, cid, window, None, **knobs) for cid in _ids(engine)
    )


def check_partial_read(
    engine: Engine, settings: Settings, cid: str, window: int, leaf: int | None, **knobs: Any
) -> bool:
    """The request read partly equals the one from the whole stored branch ending at ``leaf``,
    or both give the same budget error; whether the partial read left rows unread."""
    with session_scope(engine) as session:
        state = reads.load_whole_branch(session, cid, leaf)
        model, _ = reads.conversation_head(session, cid)
    try:
        whole = assemble(
            state.branch, model=model, window=window,
            safety_margin=settings.safety_margin, summary=state.summary,
            clearings=state.clearings, **knobs,
        ).as_dict()  # fmt: skip
    except BudgetError as exc:
        with pytest.raises(BudgetError) as raised:
            service.assemble(engine, cid, settings, leaf=leaf, max_input_tokens=window, **knobs)
        assert str(raised.value) == str(exc)
        return False
    budget = tokens.available_tokens(window, settings.safety_margin)
    with session_scope(engine) as session:
        loaded = reads.load_request_branch(session, cid, leaf, budget)
    fast = service.assemble(engine, cid, settings, leaf=leaf, max_input_tokens=window, **knobs)
    served = fast.as_dict()
    assert served.pop("max_output_tokens") >= 0
    assert json.dumps(served) == json.dumps(whole), (cid, leaf, window)
    return bool(loaded.omitted)


@pytest.mark.parametrize("window", WINDOWS)
def test_partial_reads_give_the_same_request(
    data_db: Path, settings: Settings, window: int
) -> None:
    """Leaving unread the old messages that cannot fit changes no byte of any request."""
    engine = _engine(data_db)
    partial = _same_as_whole_branch(engine, settings, window)
    engine.dispose()
    assert partial > 0 or window == WINDOWS[-1]


def test_every_conversation_text_only_with_cache_marks(data_db: Path, settings: Settings) -> None:
    """The text-only rendering with cache marks holds the same rules and has no tool roles."""
    engine = _engine(data_db)
    for cid in _ids(engine):
        try:
            request = service.assemble(
                engine, cid, settings, max_input_tokens=60_000, reminder=REMINDER,
                text_only=True, cache_breakpoints=True,
            )  # fmt: skip
        except BudgetError:
            continue
        assert all(m["role"] != "tool" and "tool_calls" not in m for m in request.messages)
        assert request.tokens.total <= request.budget
    engine.dispose()


def _summarize_and_clear(engine: Engine) -> int:
    """Give each longer conversation a summary at its middle message and clear the tool results
    after it but the newest few, as compression would; returns how many were summarized."""
    done = 0
    for cid in _ids(engine):
        with session_scope(engine) as session:
            state = reads.load_whole_branch(session, cid)
            branch = state.branch
            if len(branch) < 6:
                continue
            cutoff = branch[len(branch) // 2]
            encoding = tokens.encoding_name_for(reads.conversation_head(session, cid)[0])
            session.add(
                Summary(
                    conversation_id=cid,
                    cutoff_message_id=cutoff.id,
                    text=f"## Goal\nFinish the task of {cid}.",
                    tokens=20,
                    encoding=encoding,
                    model="test",
                    created_at=utcnow(),
                )
            )
            results = [m for m in branch[len(branch) // 2 + 1 :] if m.role == "tool"]
            for message in results[:-KEEP_UNCLEARED]:
                if message.id in state.clearings:  # sent shortened by an earlier request
                    continue
                placeholder = {
                    **message.to_openai(),
                    "content": cleared_placeholder(
                        tool_name=message.name,
                        call_id=message.tool_call_id or "",
                        tokens=message.tokens,
                    ),
                }
                saved = message.tokens - tokens.count_message(placeholder, encoding)
                session.add(
                    Clearing(
                        conversation_id=cid,
                        message_id=message.id,
                        reason="post_summary",
                        tokens_reclaimed=saved,
                        created_at=utcnow(),
                    )
                )
            done += 1
    return done


def test_summarized_and_cleared_copy(data_db: Path, tmp_path: Path, settings: Settings) -> None:
    """With a summary mid-branch and cleared results, requests stay valid and show both."""
    copy = tmp_path / "summarized.db"
    shutil.copy(data_db, copy)
    engine = _engine(copy)
    summarized = _summarize_and_clear(engine)
    assert summarized > 200
    valid = _assemble_all(engine, settings, 12_000)
    assert valid >= 0.95 * 244
    _same_as_whole_branch(engine, settings, 3_000)
    for cid in _ids(engine):
        try:
            request = service.assemble(engine, cid, settings, max_input_tokens=60_000)
        except BudgetError:
            continue
        with session_scope(engine) as session:
            state = reads.load_whole_branch(session, cid)
        if state.summary is None:
            continue
        texts = [m["content"] for m in request.messages if isinstance(m["content"], str)]
        assert request.summary_id == state.summary.id
        assert sum(t.startswith(SUMMARY_MESSAGE_PREFIX) for t in texts) == 1
        placeholders = {mid for mid, c in state.clearings.items() if c.reason != SHORTENED}
        sent_cleared = placeholders - set(request.dropped_message_ids)
        assert sum(t.startswith("[Cleared:") for t in texts) == len(sent_cleared)
    engine.dispose()


def test_partial_reads_match_on_every_database(engine: Engine, settings: Settings) -> None:
    """The hot-path read takes rows straight from the driver's cursor, which hands JSON columns
    back as text on SQLite and decoded on PostgreSQL: both give the same request as the whole
    stored branch, with cleared results and tool calls among the rows read."""
    records = [record for name in DATA_FILES for record in load_data(name)[:4]]
    service.import_conversations(engine, records, settings)
    with session_scope(engine) as session:
        for cid in _ids(engine):
            branch = reads.load_whole_branch(session, cid).branch
            results = [m for m in branch if m.role == "tool"]
            for message in results[:2]:
                session.add(
                    Clearing(
                        conversation_id=cid, message_id=message.id, reason="idle",
                        tokens_reclaimed=max(0, message.tokens - 20), created_at=utcnow(),
                    )
                )  # fmt: skip
    assert _same_as_whole_branch(engine, settings, 12_000) > 0
