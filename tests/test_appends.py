"""The append path: concurrent writers, reused call ids, batches, and the pairing check's
bounded read.

Concurrent appends to one conversation (processes and threads, SQLite and PostgreSQL) must all
land on its branch; parallel tool results must all reach the request, each after its call. The
pure pairing helpers are checked on tables and on seeded random branches against a plain
forward count.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, text

from recap.core import service
from recap.core.client import Recap
from recap.core.errors import InputError, NotFoundError
from recap.core.request.validate import Step, calls_needed, check_tool_pairing, open_calls_from_tail
from recap.core.settings import Settings
from recap.core.storage import store
from recap.core.storage.db import make_engine
from tests.support.cli_helpers import assert_one_line_error, recap

PROCESSES = 8
ADDS_PER_PROCESS = 50
THREADS = 8  # parallel tool calls of one assistant message, one thread per result
TURNS = 4  # assistant turns whose results the threads add, reusing call_0..call_7 each turn
START_SECONDS = 120  # seconds the children may take to connect, and then to finish
RANDOM_BRANCHES = 300
FAR_BACK = 300  # messages between a call and its result: beyond every narrow pairing read


def call(call_id: str, tool: str = "bash") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}


def assistant(*call_ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call(c) for c in call_ids]}


def result(call_id: str, content: str | None = None) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": "bash",
            "content": content or f"output of {call_id}"}  # fmt: skip


def start(engine: Engine, settings: Settings, cid: str = "c") -> None:
    record = {"id": cid, "messages": [{"role": "user", "content": "go"}]}
    service.import_conversations(engine, [record], settings)


def row_count(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM messages")).scalar_one())


def branch(engine: Engine, cid: str = "c") -> list[dict[str, Any]]:
    return list(service.export_conversation(engine, cid)["messages"])


# --- concurrency -------------------------------------------------------------------------------


def _append(url: str, cid: str, tag: str, count: int, barrier: Any) -> None:
    """One appending process: an engine and a connection of its own, then ``count`` adds once
    every process is ready."""
    try:
        engine = make_engine(url)
        engine.connect().close()
        barrier.wait(START_SECONDS)
    except BaseException:
        barrier.abort()  # the test fails at once instead of waiting for this process
        raise
    for i in range(count):
        service.add_message(engine, cid, {"role": "user", "content": f"{tag}-{i}"})
    engine.dispose()


def test_processes_appending_at_once_all_land_on_the_branch(
    engine: Engine, settings: Settings
) -> None:
    """8 processes x 50 adds to one conversation, released together: all 400 on the branch, each
    process's messages in its own order, no fork. The processes are forked from the test, so
    they start with its modules imported (not 8 interpreters importing them on 2 cores); each
    opens its own engine and connections."""
    start(engine, settings)
    url = engine.url.render_as_string(hide_password=False)
    processes = multiprocessing.get_context("fork")
    barrier = processes.Barrier(PROCESSES + 1)
    children = [
        processes.Process(target=_append, args=(url, "c", f"p{n}", ADDS_PER_PROCESS, barrier))
        for n in range(PROCESSES)
    ]
    for child in children:
        child.start()
    try:
        barrier.wait(START_SECONDS)  # every child connected: all released together
        for child in children:
            child.join(START_SECONDS)
        codes = [child.exitcode for child in children]
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()
    assert codes == [0] * PROCESSES
    contents = [m["content"] for m in branch(engine)]
    assert len(contents) == 1 + PROCESSES * ADDS_PER_PROCESS == row_count(engine)
    for n in range(PROCESSES):
        mine = [c for c in contents if c.startswith(f"p{n}-")]
        assert mine == [f"p{n}-{i}" for i in range(ADDS_PER_PROCESS)]


def _add_results_in_threads(client: Recap, call_ids: list[str], turn: int) -> list[int]:
    barrier = threading.Barrier(len(call_ids))
    ids: list[int] = []
    errors: list[BaseException] = []

    def add(call_id: str) -> None:
        try:
            barrier.wait()
            ids.append(client.add("c", result(call_id, f"turn {turn} {call_id}")))
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(c,)) for c in call_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return ids


def test_parallel_tool_results_from_threads_all_reach_the_request(
    engine: Engine, settings: Settings
) -> None:
    """8 threads add the 8 results of one assistant message at once, turn after turn with the
    same call ids: every result is on the branch and in the request, right after its call."""
    start(engine, settings)
    client = Recap(settings, engine)
    call_ids = [f"call_{k}" for k in range(THREADS)]
    for turn in range(TURNS):
        client.add("c", assistant(*call_ids))
        _add_results_in_threads(client, call_ids, turn)
        client.add("c", {"role": "user", "content": f"next {turn}"})
    stored = branch(engine)
    assert len(stored) == 1 + TURNS * (THREADS + 2) == row_count(engine)
    request = service.assemble(engine, "c", settings, max_input_tokens=128_000)
    messages = request.messages
    assert not request.dropped_message_ids
    for turn in range(TURNS):
        at = (
            next(i for i, m in enumerate(messages) if m.get("content") == f"next {turn}")
            - THREADS
            - 1
        )
        sent = [c["id"] for c in messages[at]["tool_calls"]]  # repeated ids get fresh names
        answers = {m["tool_call_id"]: m["content"] for m in messages[at + 1 : at + 1 + THREADS]}
        assert answers == {sent[k]: f"turn {turn} {c}" for k, c in enumerate(call_ids)}


# --- reused call ids and orphans ---------------------------------------------------------------


def test_call_id_reused_across_turns_is_accepted(engine: Engine, settings: Settings) -> None:
    """A server that numbers calls per turn (call_0 every turn): each turn's result pairs with
    that turn's call, in the stored branch and in the request."""
    start(engine, settings)
    for turn in range(3):
        service.add_message(engine, "c", assistant("call_0"))
        service.add_message(engine, "c", result("call_0", f"turn {turn}"))
        service.add_message(engine, "c", {"role": "user", "content": f"thanks {turn}"})
    request = service.assemble(engine, "c", settings, max_input_tokens=128_000)
    tools = [m["content"] for m in request.messages if m["role"] == "tool"]
    assert tools == ["turn 0", "turn 1", "turn 2"]


ORPHANS = [
    ("an id no call made", [assistant("call_0"), result("call_0")], result("call_9")),
    ("an answered call", [assistant("call_0"), result("call_0")], result("call_0")),
    ("a third result of two calls", [assistant("a", "a"), result("a"), result("a")], result("a")),
    ("a call on another branch", [], result("x")),
]


@pytest.mark.parametrize(("case", "before", "orphan"), ORPHANS, ids=[c[0] for c in ORPHANS])
def test_a_result_answering_no_open_call_is_refused(
    engine: Engine,
    settings: Settings,
    case: str,
    before: list[dict[str, Any]],
    orphan: dict[str, Any],
) -> None:
    """One clear error naming the call, and nothing written."""
    start(engine, settings)
    for message in before:
        service.add_message(engine, "c", message)
    if case == "a call on another branch":  # the call is on a sibling of the branch head
        fork = service.add_message(engine, "c", assistant("x"))
        service.add_message(engine, "c", {"role": "user", "content": "edit"}, parent_id=1)
        assert fork not in [m["id"] for m in branch(engine)]
    rows = row_count(engine)
    with pytest.raises(InputError, match=r"tool result '\w+' answers no earlier call"):
        service.add_message(engine, "c", orphan)
    assert row_count(engine) == rows


def test_two_calls_with_one_id_take_two_results(engine: Engine, settings: Settings) -> None:
    """Open calls are counted per id: two calls named alike take two results."""
    start(engine, settings)
    service.add_message(engine, "c", assistant("a", "a"))
    service.add_message(engine, "c", result("a"))
    service.add_message(engine, "c", result("a"))
    assert [m["role"] for m in branch(engine)] == ["user", "assistant", "tool", "tool"]


def test_a_call_far_back_is_found_and_an_orphan_far_down_still_refused(
    engine: Engine, settings: Settings
) -> None:
    """Correctness never depends on the narrow read: a call 300 messages back still pairs (the
    wider read finds it), and an orphan on a long branch is still refused."""
    filler = [{"role": "user", "content": f"note {i}"} for i in range(FAR_BACK)]
    record = {"id": "c", "messages": [{"role": "user", "content": "go"}, assistant("far"), *filler]}
    service.import_conversations(engine, [record], settings)
    service.add_message(engine, "c", result("far"))
    rows = row_count(engine)
    with pytest.raises(InputError, match="answers no earlier call"):
        service.add_message(engine, "c", result("far"))
    assert row_count(engine) == rows


def test_many_results_of_one_message_pair_past_the_narrow_read(
    engine: Engine, settings: Settings
) -> None:
    """An assistant message with 20 calls: every result pairs (the later ones are found by the
    wider read), and a 21st is refused."""
    start(engine, settings)
    ids = [f"call_{k}" for k in range(20)]
    service.add_message(engine, "c", assistant(*ids))
    for call_id in reversed(ids):
        service.add_message(engine, "c", result(call_id))
    with pytest.raises(InputError, match="'call_0' answers no earlier call"):
        service.add_message(engine, "c", result("call_0"))
    assert len(branch(engine)) == 22


def test_explicit_parent_still_branches(engine: Engine, settings: Settings) -> None:
    """A parent starts a sibling branch; an add without one goes after the newest message."""
    start(engine, settings)
    first = service.add_message(engine, "c", {"role": "assistant", "content": "a1"})
    edit = service.add_message(engine, "c", {"role": "assistant", "content": "a1'"}, parent_id=1)
    after = service.add_message(engine, "c", {"role": "user", "content": "q2"})
    assert [m["id"] for m in branch(engine)] == [1, edit, after]
    assert first not in [m["id"] for m in branch(engine)]
    with pytest.raises(NotFoundError, match="999"):
        service.add_message(engine, "c", {"role": "user", "content": "x"}, parent_id=999)


# --- add_many ----------------------------------------------------------------------------------


def test_add_many_appends_one_turn_and_pairs_across_it(engine: Engine, settings: Settings) -> None:
    """An assistant message and its results in one call: ids in order, one chain."""
    start(engine, settings)
    client = Recap(settings, engine)
    ids = client.add_many("c", [assistant("call_0", "call_1"), result("call_1"), result("call_0")])
    assert ids == sorted(ids) and len(ids) == 3
    assert [m["id"] for m in branch(engine)][1:] == ids
    more = client.add_many("c", [assistant("call_0"), result("call_0")])  # reused next turn
    assert len(more) == 2


def test_add_many_is_all_or_nothing(engine: Engine, settings: Settings) -> None:
    """A batch whose last result answers nothing writes none of its messages."""
    start(engine, settings)
    rows = row_count(engine)
    batch = [assistant("call_0"), result("call_0"), result("call_0")]
    with pytest.raises(InputError, match="message 2: tool result 'call_0'"):
        service.add_many(engine, "c", batch)
    with pytest.raises(InputError, match="at least one"):
        service.add_many(engine, "c", [])
    assert row_count(engine) == rows


def test_add_many_results_answer_calls_on_the_branch(engine: Engine, settings: Settings) -> None:
    """Results for calls already stored (the turn's calls came in an earlier add)."""
    start(engine, settings)
    service.add_message(engine, "c", assistant("a", "b"))
    ids = service.add_many(engine, "c", [result("b"), result("a")])
    assert [m["tool_call_id"] for m in branch(engine)[-2:]] == ["b", "a"]
    assert len(ids) == 2


# --- the command line --------------------------------------------------------------------------


def test_cli_add_reused_call_id_and_orphan(sqlite_engine: Engine, settings: Settings) -> None:
    """`recap add` pairs a reused call_0 and refuses an orphan in one line, writing nothing."""
    start(sqlite_engine, settings)
    for _ in range(2):
        calls = json.dumps([call("call_0")])
        assert recap("add", "c", "--role", "assistant", "--tool-calls", calls).code == 0
        added = recap("add", "c", "--role", "tool", "--content", "ok", "--tool-call-id",
                      "call_0", "--json")  # fmt: skip
        assert added.json()["message_id"] > 0
    rows = row_count(sqlite_engine)
    orphan = recap("add", "c", "--role", "tool", "--content", "x", "--tool-call-id", "call_0")
    assert_one_line_error(orphan, "tool result 'call_0' answers no earlier call")
    assert row_count(sqlite_engine) == rows


# --- the pure pairing helpers ------------------------------------------------------------------


def steps(*items: tuple[str, str | None, tuple[str, ...]]) -> list[Step]:
    """Steps newest first."""
    return [Step(*item) for item in items]


A, T = "assistant", "tool"
TAIL_CASES = [
    # newest first, needed, reached_root, expected
    (steps((A, None, ("x",))), {"x": 1}, False, {"x": 1}),
    (steps((T, "x", ()), (A, None, ("x", "y"))), {"x": 1}, False, None),
    (steps((T, "x", ()), (A, None, ("x", "y"))), {"x": 1}, True, {"x": 0}),
    (steps((T, "x", ()), (A, None, ("x", "y"))), {"y": 1}, False, {"y": 1}),
    (steps((A, None, ("x",)), (T, "x", ()), (A, None, ("x",))), {"x": 1}, False, {"x": 1}),
    (steps((A, None, ("x", "x"))), {"x": 2}, False, {"x": 2}),
    (steps((A, None, ("x",))), {"x": 2}, False, None),
    (steps((A, None, ("x",))), {"x": 2}, True, {"x": 1}),
    (steps(("user", None, ())), {"x": 1}, True, {"x": 0}),
    ([], {"x": 1}, True, {"x": 0}),
]


@pytest.mark.parametrize(("tail", "needed", "root", "expected"), TAIL_CASES)
def test_open_calls_from_tail(
    tail: list[Step], needed: dict[str, int], root: bool, expected: dict[str, int] | None
) -> None:
    """Open counts from the newest messages: enough, exact at the root, or undecided."""
    assert open_calls_from_tail(tail, needed, reached_root=root) == expected


def test_calls_needed_counts_results_the_batch_does_not_answer() -> None:
    """Results answer the batch's own calls first; the rest must be open on the branch."""
    batch = [result("a"), assistant("a", "b"), result("a"), result("b"), result("b")]
    assert calls_needed(batch) == Counter({"a": 1, "b": 1})


def _random_branch(rng: random.Random) -> list[dict[str, Any]]:
    """A valid branch: calls from a small id pool (reused), each result for an open call."""
    messages: list[dict[str, Any]] = []
    pending: Counter[str] = Counter()
    for _ in range(rng.randint(0, 40)):
        open_ids = sorted(k for k, v in pending.items() if v > 0)
        if open_ids and rng.random() < 0.5:
            chosen = rng.choice(open_ids)
            pending[chosen] -= 1
            messages.append(result(chosen))
        elif rng.random() < 0.6:
            ids = [f"call_{rng.randint(0, 2)}" for _ in range(rng.randint(1, 3))]
            pending.update(ids)
            messages.append(assistant(*ids))
        else:
            messages.append({"role": "user", "content": "u"})
    return messages


def _open_reference(messages: list[dict[str, Any]]) -> Counter[str]:
    pending: Counter[str] = Counter()
    for message in messages:
        if message["role"] == "assistant":
            pending.update(c["id"] for c in message["tool_calls"])
        elif message["role"] == "tool":
            pending[message["tool_call_id"]] -= 1
    return pending


def test_open_calls_from_tail_agrees_with_a_forward_count() -> None:
    """Seeded random branches, any window: a decided answer is the forward count capped at what
    is needed, and the whole branch always decides."""
    rng = random.Random(20261130)
    for _ in range(RANDOM_BRANCHES):
        messages = _random_branch(rng)
        reference = _open_reference(messages)
        needed = {f"call_{k}": rng.randint(1, 3) for k in range(rng.randint(1, 3))}
        tail = [
            Step(m["role"], m.get("tool_call_id"), tuple(c["id"] for c in m.get("tool_calls", ())))
            for m in reversed(messages)
        ]
        window = rng.randint(0, len(tail))
        whole = open_calls_from_tail(tail, needed, reached_root=True)
        assert whole == {k: min(reference[k], n) for k, n in needed.items()}
        part = open_calls_from_tail(tail[:window], needed, reached_root=window == len(tail))
        assert part is None or part == whole
        pairing_ok = all(reference[k] >= n for k, n in needed.items())
        batch = [result(k) for k, n in needed.items() for _ in range(n)]
        if pairing_ok:
            check_tool_pairing(batch, "", open_calls=whole)
        else:
            with pytest.raises(InputError):
                check_tool_pairing(batch, "", open_calls=whole)


def test_walk_back_reads_no_content(sqlite_engine: Engine, settings: Settings) -> None:
    """The pairing read selects ids, parents, roles and call ids: never content."""
    for dialect, calls in store._CALL_IDS.items():
        statement = store._WALK.format(calls=calls)
        assert "content" not in statement and "arguments" not in statement, dialect
