"""The aged stage stored and run, on SQLite and PostgreSQL: one clearings row per message and
stage (migration 0010), the rows merged on read (as of any time), the idle sweep clearing aged
results with the saving it adds, the skip's SQL bound, and a conversation taken through the
decision by ``Recap.compress``: aged first, cleared later, every step reported as what it was."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from recap.core import lifecycle
from recap.core.client import Recap
from recap.core.decision import policy
from recap.core.decision.toolresults import IDLE, POST_SUMMARY, PRESSURE, plan_clearings
from recap.core.settings import Settings
from recap.core.storage import compressed, reads, snapshot
from recap.core.storage.db import make_engine, session_scope
from recap.core.storage.migrate import alembic_config, current_revision, upgrade
from recap.core.storage.models import utcnow
from recap.core.storage.sweep import apply_clearings, sweep_idle
from recap.core.values.records import AGED, ARGUMENTS, CLEARED
from tests.test_sweep import make_idle

MODEL = "gpt-4o-mini"
LONG_ARGS = json.dumps({"path": "src/app.py", "content": "x = 1\n" * 150})
AGED_MARK = "characters of this output are left out here to save context"


def _output(tag: str, lines: int = 500) -> str:
    return "\n".join(
        f"{tag} line {i}: value={i * 7} status=ok path=src/m{i % 13}.py" for i in range(lines)
    )


def _agent(recap: Recap, cid: str, steps: int, *, lines: int = 500) -> list[int]:
    """A user turn and ``steps`` tool steps with long arguments; the result ids."""
    recap.add(cid, {"role": "user", "content": "fix the failing test"})
    results = []
    for step in range(steps):
        call = {
            "id": f"c{step}",
            "type": "function",
            "function": {"name": "edit_file", "arguments": LONG_ARGS},
        }
        recap.add(cid, {"role": "assistant", "content": None, "tool_calls": [call]})
        results.append(
            recap.add(
                cid,
                {
                    "role": "tool",
                    "tool_call_id": f"c{step}",
                    "name": "edit_file",
                    "content": _output(f"s{step}", lines),
                },
            )
        )
    return results


@pytest.fixture
def recap(engine: Engine, settings: Settings) -> Recap:
    return Recap(settings, engine)


def _knobs(recap: Recap) -> policy.Knobs:
    """The settings' knobs, keeping the arguments of the last three calls only."""
    return replace(policy.Knobs.from_settings(recap.settings), keep_tool_arguments=3)


def _branch(engine: Engine, cid: str) -> reads.RequestBranch:
    with session_scope(engine) as session:
        return reads.load_whole_branch(session, cid)


# --- the schema --------------------------------------------------------------------------------


def test_the_migration_keeps_old_clearings_and_allows_one_row_per_stage(db_url: str) -> None:
    """From 0009 with a cleared result stored: the row becomes a ``cleared`` step; a message
    takes one row per stage, never two of one; down again, the aged steps go and the old key
    returns."""
    from alembic import command

    engine = make_engine(db_url)
    upgrade(engine, "0009")
    now = utcnow()
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO conversations (id, model, created_at, last_activity_at, dirty) "
                "VALUES ('c', 'gpt-4o-mini', :now, :now, false)"
            ),
            {"now": now},
        )
        connection.execute(
            text(
                "INSERT INTO clearings (conversation_id, message_id, reason, tokens_reclaimed, "
                "created_at) VALUES ('c', 7, 'idle', 120, :now)"
            ),
            {"now": now},
        )
    upgrade(engine)
    insert = text(
        "INSERT INTO clearings (conversation_id, message_id, reason, tokens_reclaimed, "
        "created_at, stage, kept_chars) VALUES ('c', :mid, 'pressure', 50, :now, :stage, 4000)"
    )
    with engine.begin() as connection:
        stage = connection.execute(text("SELECT stage FROM clearings WHERE message_id = 7"))
        assert stage.scalar_one() == CLEARED
        connection.execute(insert, {"mid": 8, "now": now, "stage": AGED})
        connection.execute(insert, {"mid": 8, "now": now, "stage": CLEARED})
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(insert, {"mid": 8, "now": now, "stage": AGED})
    command.downgrade(alembic_config(engine), "0009")
    assert current_revision(engine) == "0009"
    with engine.begin() as connection:
        rows = connection.execute(text("SELECT message_id FROM clearings ORDER BY message_id"))
        assert [row[0] for row in rows] == [7, 8]
    upgrade(engine)
    engine.dispose()


# --- writing and reading steps -----------------------------------------------------------------


def test_steps_are_stored_merged_and_read_as_of(engine: Engine, recap: Recap) -> None:
    """A post-summary plan ages results and shortens arguments, a later idle plan clears the
    aged results: the rows merge on read as the decision merged them, a second write of a plan
    records nothing, and as of a moment between the two the results read aged."""
    cid = recap.new("steps", model=MODEL)
    results = _agent(recap, cid, 5)
    knobs = _knobs(recap)
    branch = _branch(engine, cid).branch
    ageing = policy.post_summary_clearing(branch, {}, knobs)
    assert ageing.count(AGED) == 2 and ageing.count(ARGUMENTS) == 2
    first = utcnow() - timedelta(minutes=5)
    with session_scope(engine) as session:
        applied = apply_clearings(session, cid, ageing, now=first)
        again = apply_clearings(session, cid, ageing, now=first)
    assert (applied.aged, applied.arguments, applied.cleared) == (2, 2, 0)
    assert applied.tokens_reclaimed == ageing.tokens_reclaimed and again.steps == 0
    assert applied.describe().startswith("aged 2 old tool results, shortened the arguments of 2")
    aged = _branch(engine, cid).clearings
    assert aged == policy.with_plan({}, ageing)
    clearing = policy.idle_clearing(branch, aged, knobs)
    assert clearing.message_ids == results[:4]  # the idle sweep keeps one
    with session_scope(engine) as session:
        cleared = apply_clearings(session, cid, clearing)
    assert cleared.cleared == 4 and cleared.tokens_reclaimed == clearing.tokens_reclaimed
    now = _branch(engine, cid).clearings
    assert now == policy.with_plan(aged, clearing)
    assert {now[mid].stage for mid in results[:4]} == {CLEARED}
    with session_scope(engine) as session:
        then = compressed.load_clearings(session, cid, first + timedelta(seconds=1))
    assert then == aged


def test_the_sweep_clears_aged_results_with_what_it_adds(engine: Engine, recap: Recap) -> None:
    """The set-based idle sweep records what ``idle_clearing`` plans for aged results: the same
    messages, the same rows, and it reports the tokens the clearing adds to the ageing."""
    cid = recap.new("sweep", model=MODEL)
    _agent(recap, cid, 6)
    knobs = _knobs(recap)
    branch = _branch(engine, cid).branch
    ageing = policy.post_summary_clearing(branch, {}, knobs)
    with session_scope(engine) as session:
        apply_clearings(session, cid, ageing)
    make_idle(engine, cid)
    aged = _branch(engine, cid).clearings
    planned = policy.idle_clearing(branch, aged, knobs)
    done = sweep_idle(engine, recap.settings, now=utcnow())
    assert done.cleared == len(planned) and done.tokens_reclaimed == planned.tokens_reclaimed
    assert _branch(engine, cid).clearings == policy.with_plan(aged, planned)
    assert sweep_idle(engine, recap.settings, now=utcnow()).cleared == 0


def test_the_skip_bound_counts_every_stage_once(engine: Engine, recap: Recap) -> None:
    """``history_bound``'s history (SQL over the clearings rows) equals the snapshot's estimate
    with results aged, cleared after ageing, and arguments shortened beside."""
    cid = recap.new("bound", model=MODEL)
    _agent(recap, cid, 6)
    knobs = _knobs(recap)
    branch = _branch(engine, cid).branch
    ageing = policy.post_summary_clearing(branch, {}, knobs)
    with session_scope(engine) as session:
        apply_clearings(session, cid, ageing)
    clearing = policy.idle_clearing(branch, policy.with_plan({}, ageing), knobs)
    clearing = type(clearing)(clearing.reason, clearing.items[:2])  # some aged ones stay aged
    with session_scope(engine) as session:
        apply_clearings(session, cid, clearing)
    with session_scope(engine) as session:
        bound = snapshot.history_bound(session, cid)
        whole = snapshot.read_snapshot(session, cid)
    assert bound is not None
    states = {c.stage for c in whole.clearings.values()}
    assert states == {AGED, CLEARED, ARGUMENTS}
    assert bound.history == policy.history_estimate(whole)


def test_the_snapshot_carries_long_arguments_only(engine: Engine, recap: Recap) -> None:
    """The decision sees a call's arguments only when they are long enough to shorten, and
    plans the same steps from the snapshot as from the whole branch."""
    cid = recap.new("slim", model=MODEL)
    _agent(recap, cid, 5)
    recap.add(cid, {"role": "user", "content": "and a short one"})
    call = {"id": "s1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    recap.add(cid, {"role": "assistant", "content": None, "tool_calls": [call]})
    recap.add(cid, {"role": "tool", "tool_call_id": "s1", "content": "a.py"})
    with session_scope(engine) as session:
        slim = snapshot.read_snapshot(session, cid).branch
    whole = _branch(engine, cid).branch
    calls = [m.tool_calls[0]["function"] for m in slim if m.tool_calls]
    assert [("arguments" in f) for f in calls] == [True] * 5 + [False]
    common: dict[str, Any] = {
        "keep_last": 1,
        "protected": (),
        "min_tokens": 1,
        "reason": PRESSURE,
        "stage": AGED,
        "aged_chars": 4_000,
        "keep_arguments": 1,
    }
    assert plan_clearings(slim, {}, **common) == plan_clearings(whole, {}, **common)


# --- the decision, run -------------------------------------------------------------------------


def _window_between(recap: Recap, cid: str, low: int, high: int) -> int:
    """A window whose trigger lies between ``low`` and ``high`` history tokens."""
    with session_scope(recap.engine) as session:
        head = snapshot.read_snapshot(session, cid)
    knobs = policy.Knobs.from_settings(recap.settings)
    for window in range(2_000, 400_000, 100):
        trigger = policy.pressure(
            policy.Snapshot(
                conversation_id=cid,
                model=MODEL,
                window_override=window,
                branch=head.branch,
                summary=None,
                clearings=head.clearings,
                profile=None,
                now=head.now,
            ),
            knobs,
        ).trigger
        if low <= trigger < high:
            return window
    raise AssertionError("no window between")


def test_compress_ages_first_then_clears(engine: Engine, recap: Recap) -> None:
    """Over the trigger by less than ageing saves: the run ages (its reason says so), the
    request sends the aged results within their cap naming their saved file and reference, the
    timeline and stats say ``aged``; over it again by more: the run clears them."""
    cid = recap.new("run", model=MODEL)
    results = _agent(recap, cid, 6, lines=2_500)  # outputs cut on the way in: saved files
    whole = _branch(engine, cid)
    history = policy.history_estimate(
        policy.Snapshot(
            conversation_id=cid,
            model=MODEL,
            window_override=None,
            branch=whole.branch,
            summary=None,
            clearings={},
            profile=None,
            now=utcnow(),
        )
    )
    knobs = policy.Knobs.from_settings(recap.settings)
    ageing = plan_clearings(
        whole.branch,
        {},
        keep_last=knobs.keep_tool_results,
        protected=knobs.protected_tools,
        min_tokens=1,
        reason=PRESSURE,
        stage=AGED,
        aged_chars=knobs.aged_result_chars,
        keep_arguments=knobs.keep_tool_arguments,
    )
    assert ageing.count(AGED) == 3
    window = _window_between(recap, cid, history - ageing.tokens_reclaimed + 200, history - 200)
    with session_scope(engine) as session:
        session.execute(
            text("UPDATE conversations SET max_input_tokens = :w WHERE id = :cid"),
            {"w": window, "cid": cid},
        )
    done = recap.compress(cid)
    assert done.action == "cleared", done
    assert done.reason.startswith("aged 3 old tool results"), done.reason
    request = recap.assemble(cid)
    sent = {m.get("tool_call_id"): m["content"] for m in request.messages if m["role"] == "tool"}
    for step, result in enumerate(results[:3]):
        content = sent[f"c{step}"]
        assert AGED_MARK in content and f"ref=m{result}" in content
        assert len(content) <= recap.settings.aged_result_chars
        assert "saved at" in content
    stored = _branch(engine, cid)
    assert {stored.clearings[mid].stage for mid in results[:3]} == {AGED}
    shown = lifecycle.timeline(engine, cid, recap.settings).as_dict()["messages"]
    states = {m["id"]: m["state"] for m in shown}
    assert [states[mid] for mid in results] == ["aged"] * 3 + ["full"] * 3
    log = recap.engine.connect()
    try:
        reason = (
            log.execute(
                text("SELECT reason FROM compaction_log WHERE conversation_id = :cid ORDER BY id"),
                {"cid": cid},
            )
            .scalars()
            .all()
        )
    finally:
        log.close()
    assert reason[-1].startswith("aged 3 old tool results")
    # more steps, and a window where ageing the new results is not enough: the run clears
    # (a clearing again, not weighed here against a summary: RECAP_WEIGH_CLEARING off)
    recap.settings = recap.settings.model_copy(update={"weigh_clearing": False})
    for step in range(6, 9):
        call = {"id": f"c{step}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        recap.add(cid, {"role": "assistant", "content": None, "tool_calls": [call]})
        result = {"role": "tool", "tool_call_id": f"c{step}", "content": _output(f"s{step}", 2_500)}
        recap.add(cid, result)
    with session_scope(engine) as session:
        now = snapshot.read_snapshot(session, cid)
    history = policy.history_estimate(now)
    plans = {
        stage: plan_clearings(
            now.branch,
            now.clearings,
            keep_last=knobs.keep_tool_results,
            protected=knobs.protected_tools,
            min_tokens=1,
            reason=PRESSURE,
            stage=stage,
            aged_chars=knobs.aged_result_chars,
            keep_arguments=knobs.keep_tool_arguments,
        ).tokens_reclaimed
        for stage in (AGED, CLEARED)
    }
    window = _window_between(
        recap, cid, history - plans[CLEARED] + 200, history - plans[AGED] - 200
    )
    with session_scope(engine) as session:
        session.execute(
            text("UPDATE conversations SET max_input_tokens = :w WHERE id = :cid"),
            {"w": window, "cid": cid},
        )
    assert recap.stats(cid).suggest_compress
    again = recap.compress(cid)
    assert again.action == "cleared" and again.reason.startswith("cleared 6 old"), again
    after = _branch(engine, cid).clearings
    assert all(after[mid].stage == CLEARED for mid in results), "aged -> cleared, full -> cleared"


def test_recall_gives_an_aged_result_back_whole(engine: Engine, recap: Recap) -> None:
    """The reference an aged result names brings back its stored output."""
    cid = recap.new("recall", model=MODEL)
    results = _agent(recap, cid, 5)
    knobs = _knobs(recap)
    with session_scope(engine) as session:
        apply_clearings(
            session, cid, policy.post_summary_clearing(_branch(engine, cid).branch, {}, knobs)
        )
    original = next(m for m in _branch(engine, cid).branch if m.id == results[0])
    recalled = recap.recall(cid, f"m{results[0]}")
    assert original.content is not None and original.content[:200] in recalled.text
    assert POST_SUMMARY and IDLE  # the reasons a stored step names
