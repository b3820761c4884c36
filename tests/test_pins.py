"""Pinned messages end to end (``Recap.pin``, ``recap pin``) on SQLite and PostgreSQL: the
errors, the cap, a pin across a real summary and across branches, clearings that never take a
pinned result (the decision, the sweep, a late write), the request-state key, erasure, the CLI's
bad input; and the decision's arithmetic with pins as plain values."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from recap.core import lifecycle, service
from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.core.decision import policy
from recap.core.errors import NotFoundError, PinLimitError
from recap.core.request.timeline import PINNED, SUMMARIZED
from recap.core.settings import get_settings
from recap.core.storage import pins as stored_pins
from recap.core.storage import snapshot as snapshots
from recap.core.storage.db import session_scope
from recap.core.storage.models import CLEARINGS, PINS
from recap.core.storage.sweep import apply_clearings, sweep_idle
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from recap.core.values.records import Msg, SummaryRec
from tests.support.cli_helpers import assert_one_line_error, recap
from tests.test_compress_worker import chat, turn_text
from tests.test_lifecycle import remaining_rows, tool_turn

WINDOW = 3_000  # a dozen turns of ``chat`` go over the trigger


def client_for(engine: Engine) -> Recap:
    return Recap(get_settings(), engine)


def imported(engine: Engine, cid: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    client = client_for(engine)
    service.import_conversations(
        engine,
        [{"id": cid, "messages": messages}],
        client.settings,
        max_input_tokens=WINDOW,
        prepare=client._ingest,
    )
    return list(service.export_conversation(engine, cid)["messages"])


def contents(request: Any) -> list[str]:
    return [str(m.get("content")) for m in request.messages]


def pin_count(engine: Engine, cid: str) -> int:
    with engine.connect() as connection:
        statement = select(func.count()).where(PINS.c.conversation_id == cid)
        return int(connection.execute(statement).scalar() or 0)


# --- pin and unpin -------------------------------------------------------------------------------


def test_pin_and_unpin_round_trip(engine: Engine) -> None:
    stored = imported(engine, "c", chat(3))
    client = client_for(engine)
    size = stored[1]  # the first user message
    first = client.pin("c", size["id"])
    assert first.pinned and first.changed and first.pinned_tokens > 0
    assert first.max_pinned_tokens == get_settings().max_pinned_tokens
    again = client.pin("c", size["id"])
    assert again.pinned and not again.changed and again.pinned_tokens == first.pinned_tokens
    off = client.unpin("c", size["id"])
    assert not off.pinned and off.changed and off.pinned_tokens == 0
    assert not client.unpin("c", size["id"]).changed
    assert dict(off) == off.as_dict()


def test_pin_errors_name_the_problem_and_change_nothing(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = imported(engine, "mine", chat(2))
    theirs = imported(engine, "theirs", chat(2, "t"))
    client = client_for(engine)
    with pytest.raises(NotFoundError, match="unknown conversation 'nope'"):
        client.pin("nope", 1)
    with pytest.raises(NotFoundError, match="message 99999 is not in conversation 'mine'"):
        client.pin("mine", 99_999)
    with pytest.raises(NotFoundError, match=f"message {theirs[1]['id']} is not in conversation"):
        client.pin("mine", theirs[1]["id"])
    with pytest.raises(NotFoundError, match="is not in conversation"):
        client.unpin("mine", theirs[1]["id"])
    client.pin("mine", mine[1]["id"])
    before = client.pin("mine", mine[1]["id"]).pinned_tokens
    monkeypatch.setenv("RECAP_MAX_PINNED_TOKENS", str(before + 5))
    get_settings.cache_clear()
    capped = client_for(engine)
    with pytest.raises(PinLimitError, match="RECAP_MAX_PINNED_TOKENS"):
        capped.pin("mine", mine[2]["id"])
    assert pin_count(engine, "mine") == 1
    assert capped.unpin("mine", mine[2]["id"]).pinned_tokens == before  # nothing was added


def test_the_async_client_pins_too(sqlite_engine: Engine) -> None:
    stored = imported(sqlite_engine, "c", chat(2))

    async def run() -> tuple[bool, bool]:
        async with AsyncRecap(client_for(sqlite_engine)) as handle:
            on = await handle.pin("c", stored[1]["id"])
            off = await handle.unpin("c", stored[1]["id"])
            return on.pinned, off.pinned

    assert asyncio.run(run()) == (True, False)


# --- across a summary and across branches --------------------------------------------------------


def test_a_pinned_message_follows_the_summary_that_covers_it(engine: Engine) -> None:
    stored = imported(engine, "c", chat(12))
    client = client_for(engine)
    kept = stored[3]  # the second user message: summarized by the run below
    assert kept["role"] == "user"
    client.pin("c", kept["id"])
    done = client.compress("c", force=True)
    assert done.action == "summarized" and done.cutoff_message_id > kept["id"]
    request = client.assemble("c")
    assert request.messages[0]["role"] == "system"
    assert request.messages[1]["content"].startswith("Summary")  # the summary message
    assert request.messages[2] == {"role": "user", "content": kept["content"]}
    assert contents(request).count(kept["content"]) == 1
    line = lifecycle.timeline(engine, "c", client.settings)
    states = {m.id: m.state for m in line.messages}
    assert states[kept["id"]] == PINNED
    assert states[stored[1]["id"]] == SUMMARIZED
    pinned_stats = client.stats("c")
    client.unpin("c", kept["id"])
    plain = client.assemble("c")
    assert kept["content"] not in contents(plain)
    assert request.tokens.total - plain.tokens.total == request.tokens.history - (
        plain.tokens.history
    )
    assert pinned_stats.history > client.stats("c").history  # the decision counts the pin


def test_pins_follow_their_branch(engine: Engine) -> None:
    stored = imported(engine, "c", chat(12))
    client = client_for(engine)
    shared = stored[3]  # on both branches
    fork = stored[-3]  # the last user message's parent: the branches split after it
    leaf_a = stored[-1]["id"]
    leaf_b = client.add("c", {"role": "user", "content": "branch B asks"}, parent_id=fork["id"])
    only_a = stored[-2]  # the last user message of branch A
    client.pin("c", shared["id"])
    client.pin("c", only_a["id"])
    on_b = contents(client.assemble("c", leaf=leaf_b))
    assert shared["content"] in on_b and only_a["content"] not in on_b
    on_a = contents(client.assemble("c", leaf=leaf_a))
    assert shared["content"] in on_a and only_a["content"] in on_a
    done = client.compress("c", leaf=leaf_a, force=True)
    assert done.action == "summarized" and done.cutoff_message_id > shared["id"]
    for leaf in (leaf_a, leaf_b):
        request = client.assemble("c", leaf=leaf)
        assert request.summary_id == done.summary_id
        assert request.messages[2]["content"] == shared["content"]  # right after the summary
    assert only_a["content"] not in contents(client.assemble("c", leaf=leaf_b))
    line = lifecycle.timeline(engine, "c", client.settings, leaf=leaf_b)
    assert {m.id: m.state for m in line.messages}[shared["id"]] == PINNED
    assert only_a["id"] not in {m.id for m in line.messages}


def test_a_pinned_message_is_read_even_where_the_budget_leaves_old_rows_unread(
    sqlite_engine: Engine,
) -> None:
    """The request path leaves unread the oldest rows no request can hold; never a pinned one."""
    stored = imported(sqlite_engine, "c", chat(40))
    client = client_for(sqlite_engine)
    plain = client.assemble("c")
    assert stored[1]["id"] in plain.dropped_message_ids
    client.pin("c", stored[1]["id"])
    held = client.assemble("c")
    assert stored[1]["content"] in contents(held)
    assert stored[1]["id"] not in held.dropped_message_ids


# --- clearings never take a pinned result -------------------------------------------------------


def _agent(engine: Engine, cid: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are careful."}]
    for n in range(6):
        messages += tool_turn(f"call_{n}", turn_text("tool", n) * 6)
    return imported(engine, cid, messages)


def test_no_clearing_takes_a_pinned_result(engine: Engine) -> None:
    stored = _agent(engine, "c")
    results = [m["id"] for m in stored if m["role"] == "tool"]
    client = client_for(engine)
    client.pin("c", results[0])
    with session_scope(engine) as session:
        snapshot = snapshots.read_snapshot(session, "c")
    knobs = policy.Knobs.from_settings(client.settings)
    decision = policy.decide(snapshot, knobs)
    assert decision.clear is not None and results[1] in decision.clear.message_ids
    assert results[0] not in decision.clear.message_ids
    # after a summary old results age (or clear, with the aged stage off): a pin takes no step
    for stage_knobs in (knobs, dataclasses.replace(knobs, aged_result_chars=0)):
        after = policy.post_summary_clearing(snapshot.branch, {}, stage_knobs, snapshot.pinned_ids)
        assert results[0] not in after.message_ids
    assert results[1] in after.message_ids
    later = datetime.now(UTC) + timedelta(days=1)
    swept = sweep_idle(engine, client.settings, now=later, idle_minutes=0)
    assert swept.cleared >= 1
    with engine.connect() as connection:
        cleared = {int(r[0]) for r in connection.execute(select(CLEARINGS.c.message_id))}
    assert results[0] not in cleared and results[1] in cleared
    # a plan made before the pin is written without it
    plan = ClearingPlan("pressure", (PlannedClearing(message_id=results[0], tokens_reclaimed=10),))
    with session_scope(engine) as session:
        assert apply_clearings(session, "c", plan).cleared == 0


def test_a_clearing_recorded_before_the_pin_does_not_apply_while_pinned(engine: Engine) -> None:
    stored = _agent(engine, "c")
    result = next(m for m in stored if m["role"] == "tool")
    with session_scope(engine) as session:
        plan = ClearingPlan(
            "idle", (PlannedClearing(message_id=result["id"], tokens_reclaimed=50),)
        )
        assert apply_clearings(session, "c", plan).cleared == 1
    client = client_for(engine)
    assert result["content"] not in contents(client.assemble("c"))
    client.pin("c", result["id"])
    assert result["content"] in contents(client.assemble("c"))
    line = lifecycle.timeline(engine, "c", client.settings)
    assert {m.id: m.state for m in line.messages}[result["id"]] == PINNED
    client.unpin("c", result["id"])
    assert result["content"] not in contents(client.assemble("c"))  # the clearing applies again


# --- the request state, erasure ----------------------------------------------------------------


def test_a_pin_changes_the_request_state_a_reading_measured(engine: Engine) -> None:
    stored = imported(engine, "c", chat(4))
    client = client_for(engine)
    client.assemble("c")
    client.record_usage("c", prompt_tokens=900)
    assert client.stats("c").basis == "measured"
    client.pin("c", stored[1]["id"])
    assert client.stats("c").basis == "estimated"
    client.assemble("c")
    client.record_usage("c", prompt_tokens=900)
    assert client.stats("c").basis == "measured"
    client.unpin("c", stored[1]["id"])
    assert client.stats("c").basis == "estimated"


def test_delete_removes_the_pins(engine: Engine) -> None:
    stored = imported(engine, "c", chat(3))
    client = client_for(engine)
    client.pin("c", stored[1]["id"])
    assert pin_count(engine, "c") == 1
    client.delete("c")
    assert remaining_rows(engine, "c") == {}
    assert pin_count(engine, "c") == 0


def test_as_of_uses_the_pins_made_by_then(sqlite_engine: Engine) -> None:
    stored = imported(sqlite_engine, "c", chat(12))
    client = client_for(sqlite_engine)
    client.compress("c", force=True)
    moment = datetime.now(UTC)
    client.pin("c", stored[3]["id"])
    assert stored[3]["content"] in contents(client.assemble("c"))
    assert stored[3]["content"] not in contents(client.assemble("c", as_of=moment))


# --- the CLI --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["pin", "c", "abc"], "invalid value for 'message_id'"),
        (["pin", "c", "0"], "greater than or equal to 1"),
        (["pin", "c", "99999999999999999999"], "invalid value for 'message_id'"),
        (["pin", "nope", "1"], "unknown conversation 'nope'"),
        (["pin", "c", "99999"], "message 99999 is not in conversation 'c'"),
        (["pin", "c", "99999", "--off"], "message 99999 is not in conversation 'c'"),
        (["pin", "c"], "missing argument"),
    ],
)
def test_cli_pin_bad_input(sqlite_engine: Engine, args: list[str], fragment: str) -> None:
    imported(sqlite_engine, "c", chat(2))
    assert_one_line_error(recap(*args), fragment)
    assert pin_count(sqlite_engine, "c") == 0


def test_cli_pin_and_its_cap(sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = imported(sqlite_engine, "c", chat(2))
    first, second = stored[1]["id"], stored[2]["id"]
    done = recap("pin", "c", str(first), "--json")
    assert done.code == 0, done.stderr
    assert '"pinned": true' in done.stdout and '"changed": true' in done.stdout
    assert "pinned" in recap("pin", "c", str(first)).stdout
    monkeypatch.setenv("RECAP_MAX_PINNED_TOKENS", "1")
    assert_one_line_error(recap("pin", "c", str(second)), "RECAP_MAX_PINNED_TOKENS")
    assert pin_count(sqlite_engine, "c") == 1
    off = recap("pin", "c", str(first), "--off", "--json")
    assert off.code == 0 and '"pinned": false' in off.stdout
    assert pin_count(sqlite_engine, "c") == 0
    monkeypatch.setenv("RECAP_MAX_PINNED_TOKENS", "-1")
    assert_one_line_error(recap("pin", "c", str(first)), "RECAP_MAX_PINNED_TOKENS")


# --- the decision with pins, as plain values ----------------------------------------------------


def light(mid: int, role: str, tokens: int, **kw: Any) -> Msg:
    return Msg(mid, mid - 1 if mid > 1 else None, role, None, tokens, **kw)


def snapshot_of(branch: list[Msg], pinned: tuple[int, ...], **kw: Any) -> policy.Snapshot:
    return policy.Snapshot(
        conversation_id="c",
        model="gpt-4o-mini",
        window_override=kw.pop("window", 4_000),
        branch=branch,
        summary=kw.pop("summary", None),
        clearings=kw.pop("clearings", {}),
        profile=None,
        now=datetime(2026, 1, 1, tzinfo=UTC),
        pinned=tuple(m for m in branch if m.id in pinned),
    )


def talk(turns: int, size: int) -> list[Msg]:
    branch = [light(1, "system", 20)]
    for _ in range(turns):
        branch.append(light(len(branch) + 1, "user", size))
        branch.append(light(len(branch) + 1, "assistant", size))
    return branch


@pytest.mark.parametrize(
    ("pinned", "summary_cutoff", "expected_extra"),
    [((), None, 0), ((2,), None, 0), ((2,), 5, 300), ((2, 4), 5, 600), ((1,), 5, 0)],
    ids=["none", "in-place", "summarized", "two-summarized", "the-stored-prompt"],
)
def test_history_counts_the_pins_a_summary_covers(
    pinned: tuple[int, ...], summary_cutoff: int | None, expected_extra: int
) -> None:
    branch = talk(6, 300)
    summary = (
        SummaryRec(
            id=1, cutoff_message_id=summary_cutoff, previous_summary_id=None, text="s", tokens=50
        )
        if summary_cutoff
        else None
    )
    plain = policy.history_estimate(snapshot_of(branch, (), summary=summary))
    held = policy.history_estimate(snapshot_of(branch, pinned, summary=summary))
    assert held - plain == expected_extra


def test_a_split_does_not_count_its_pinned_messages_as_replaced() -> None:
    branch = talk(12, 300)
    knobs = policy.Knobs()
    plain = policy.decide(snapshot_of(branch, ()), knobs)
    assert plain.action == policy.SUMMARIZE and plain.split is not None
    older = [m.id for m in plain.split.older]
    held = policy.decide(snapshot_of(branch, tuple(older[:2])), knobs)
    assert held.split is not None
    assert held.split.summary_room is not None and plain.split.summary_room is not None
    assert held.split.summary_room < plain.split.summary_room  # the pins sit beside it
    deeper = policy.decide(snapshot_of(branch, tuple(older)), knobs)
    assert deeper.split is not None  # over the room: it cuts deeper, past the pinned ones
    assert any(m.id not in older for m in deeper.split.older)
    everything = tuple(m.id for m in branch[1:-2])  # all but the last turn
    held_all = policy.decide(snapshot_of(branch, everything), knobs)
    assert held_all.action != policy.SUMMARIZE  # nothing left that a summary would replace
    assert "smallest span" in held_all.reason


def test_the_state_key_names_the_pins() -> None:
    from recap.core.values.profile import state_key

    base = {"model": "m", "leaf_id": 9, "summary_id": None, "clearings": (), "content_hash": "h"}
    assert state_key(**base) == state_key(**base, pins=())
    assert state_key(**base, pins=(3,)) != state_key(**base)
    assert state_key(**base, pins=(3, 5)) == state_key(**base, pins=(5, 3))
    assert state_key(**base, pins=(3,)) != state_key(**base, pins=(5,))


def test_load_pins_as_of(sqlite_engine: Engine) -> None:
    stored = imported(sqlite_engine, "c", chat(2))
    stored_pins.pin(sqlite_engine, "c", stored[1]["id"], max_tokens=10_000)
    with sqlite_engine.connect() as connection:
        assert stored_pins.load_pins(connection, "c") == {stored[1]["id"]}
        past = datetime.now(UTC) - timedelta(hours=1)
        assert stored_pins.load_pins(connection, "c", past) == frozenset()
