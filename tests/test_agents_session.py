"""``RecapSession`` holds the Agents SDK's ``Session`` contract: its settings, items given back as
the SDK stored them (types, ids, parts, reasoning with its encrypted content; seeded random
runs of every item kind), ``pop_item`` by the conversation's state, and many threads starting
one new session at once on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine

from recap.core.client import Recap
from recap.core.settings import Settings

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, Runner
from agents.memory import SessionSettings
from agents.testing import ScriptedModel

from recap.integrations.openai_agents import RecapSession
from tests.support.agents_sessions import get_text_message

SEEDS = range(12)
THREADS = 8  # more than the six the issue saw fail
ROUNDS = 4  # fresh session ids per database: the race failed about one run in four


KEEP_MEDIA = 100  # every image sent whole: older ones are otherwise aged (a placeholder), by design


@pytest.fixture
def recap(sqlite_engine: Engine, tmp_path: Any) -> Recap:
    return Recap(Settings(output_dir=tmp_path / "outputs", keep_media=KEEP_MEDIA), sqlite_engine)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# --- settings ------------------------------------------------------------------------------------


def test_session_settings_limit_default_and_dict(recap: Recap) -> None:
    """The settings' limit applies to ``get_items``; a dict is converted and checked like the
    SDK's; ``SessionSettings()`` is the default."""
    limited = RecapSession("s-limit", recap=recap, session_settings=SessionSettings(limit=3))
    items = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    run(limited.add_items(items))  # type: ignore[arg-type]
    assert run(limited.get_items()) == items[-3:]
    assert run(limited.get_items(limit=1)) == items[-1:]
    assert run(limited.get_items(limit=0)) == []
    as_dict = RecapSession("s-dict", recap=recap, session_settings={"limit": 2})
    assert as_dict.session_settings == SessionSettings(limit=2)
    assert RecapSession("s-default", recap=recap).session_settings == SessionSettings()
    with pytest.raises(TypeError, match="limitt"):
        RecapSession("s-bad", recap=recap, session_settings={"limitt": 1})


def test_runner_takes_dict_settings(recap: Recap) -> None:
    """``Runner.run`` with a session made from dict settings sends the latest items alone."""
    session = RecapSession("s-run", recap=recap, enqueue=False, session_settings={"limit": 2})
    run(session.add_items([{"role": "user", "content": f"t{i}"} for i in range(6)]))
    model = ScriptedModel()
    model.enqueue([get_text_message("ok")])
    result = run(Runner.run(Agent(name="a", model=model), "new", session=session))
    assert result.final_output == "ok"
    assert [i.get("content") for i in model.calls[-1].input] == ["t4", "t5", "new"]


# --- items as stored -----------------------------------------------------------------------------


def _ids(rng: random.Random, prefix: str) -> str:
    return f"{prefix}_{rng.getrandbits(48):012x}"


def _user(rng: random.Random) -> dict[str, Any]:
    text = f"question {rng.random():.6f} ünïcode ✓"
    if rng.random() < 0.5:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "input_text", "text": text}]
    if rng.random() < 0.3:
        image = {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"}
        parts.append(image)
    return {"type": "message", "role": "user", "content": parts}


def _response(rng: random.Random) -> list[dict[str, Any]]:
    """What one model response gives: reasoning, a message, function calls, in the SDK's
    stored form (ids, statuses, parts with annotations)."""
    items: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        summary = [{"type": "summary_text", "text": f"thinking {rng.random():.4f}"}]
        reasoning = {"type": "reasoning", "id": _ids(rng, "rs"), "summary": summary}
        if rng.random() < 0.7:
            reasoning["encrypted_content"] = "gAAAA" + "x" * rng.randint(10, 200)
        items.append(reasoning)
    calls = rng.randint(0, 2)
    if calls == 0 or rng.random() < 0.4:
        text = {"type": "output_text", "text": f"answer {rng.random():.6f}", "annotations": []}
        if rng.random() < 0.5:
            text["logprobs"] = []
        message = {"id": _ids(rng, "msg"), "type": "message", "role": "assistant"}
        items.append({**message, "status": "completed", "content": [text]})
    for _ in range(calls):
        call_id = _ids(rng, "call")
        items.append(
            {
                "type": "function_call",
                "id": _ids(rng, "fc"),
                "call_id": call_id,
                "name": rng.choice(["lookup", "search"]),
                "arguments": json.dumps({"q": str(rng.randint(0, 99))}),
                "status": "completed",
            }
        )
    return items


def _turns(rng: random.Random) -> list[list[dict[str, Any]]]:
    """Batches as a run adds them: the input, then each response with its tool outputs."""
    batches: list[list[dict[str, Any]]] = []
    for _ in range(rng.randint(1, 4)):
        batches.append([_user(rng)])
        while True:
            response = _response(rng)
            outputs = [
                {"type": "function_call_output", "call_id": i["call_id"], "output": f"r{n}"}
                for n, i in enumerate(response)
                if i["type"] == "function_call"
            ]
            batches.append(response + outputs)
            if not outputs or rng.random() < 0.3:
                break
    return batches


@pytest.mark.parametrize("seed", SEEDS)
def test_items_round_trip_as_stored(recap: Recap, seed: int) -> None:
    """Whatever the run adds, ``get_items`` gives back equal items in order (with any limit),
    and ``pop_item`` the newest one each time until the session is empty."""
    rng = random.Random(seed)
    session = RecapSession(f"rt-{seed}", recap=recap, enqueue=False)
    added: list[dict[str, Any]] = []
    for batch in _turns(rng):
        run(session.add_items(batch))  # type: ignore[arg-type]
        added += batch
    assert run(session.get_items()) == added
    limit = rng.randint(1, len(added))
    assert run(session.get_items(limit=limit)) == added[-limit:]
    while added:
        assert run(session.pop_item()) == added.pop()
        if rng.random() < 0.3:
            assert run(session.get_items()) == added
    assert run(session.pop_item()) is None
    assert run(session.get_items()) == []


def test_pop_is_the_conversations_not_the_objects(recap: Recap) -> None:
    """Two session objects on one conversation pop different items, and each sees the other's
    pop and the add that follows it."""
    first = RecapSession("shared", recap=recap, enqueue=False)
    second = RecapSession("shared", recap=recap, enqueue=False)
    items = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    run(first.add_items(items))  # type: ignore[arg-type]
    run(first.add_items([{"role": "user", "content": "c"}]))
    assert run(first.pop_item()) == {"role": "user", "content": "c"}
    assert run(second.pop_item()) == {"role": "user", "content": "b"}
    assert run(first.get_items()) == [{"role": "user", "content": "a"}]
    run(second.add_items([{"role": "user", "content": "d"}]))
    assert [i["content"] for i in run(first.get_items())] == ["a", "d"]
    run(first.clear_session())
    assert run(second.get_items()) == []


# --- many threads, one new session ---------------------------------------------------------------


def _first_use(recap: Recap, session_id: str) -> list[BaseException]:
    """``THREADS`` threads, each with its own event loop and session object, add two items to
    one new session at once; the errors they met."""
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        session = RecapSession(session_id, recap=recap, enqueue=False)
        barrier.wait()
        try:
            items = [{"role": "user", "content": f"{n}-{k}"} for k in range(2)]
            run(session.add_items(items))  # type: ignore[arg-type]
        except BaseException as exc:  # each error is the test's to report
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_concurrent_first_use(engine: Engine, tmp_path: Any) -> None:
    """The session is created once, no thread fails, and every item is stored (SQLite and
    PostgreSQL)."""
    recap = Recap(Settings(output_dir=tmp_path / "outputs"), engine)
    for _ in range(ROUNDS):
        session_id = f"first-{uuid.uuid4().hex[:8]}"
        assert _first_use(recap, session_id) == []
        stored = run(RecapSession(session_id, recap=recap).get_items())
        expected = {f"{n}-{k}" for n in range(THREADS) for k in range(2)}
        assert sorted(i["content"] for i in stored) == sorted(expected)


def test_large_output_is_stored_as_its_preview(recap: Recap) -> None:
    """A tool output over ``RECAP_MAX_OUTPUT_BYTES`` is stored as Recap's preview alone (the
    row does not keep the original beside it) and given back as that preview; the call keeps
    its item as stored."""
    session = RecapSession("large", recap=recap, enqueue=False)
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "c1",
        "name": "dump",
        "arguments": "{}",
        "status": "completed",
    }
    big = "\n".join(f"line {n} " + "x" * 60 for n in range(recap.settings.max_output_lines + 50))
    output = {"type": "function_call_output", "call_id": "c1", "output": big}
    run(session.add_items([{"role": "user", "content": "dump it"}]))
    run(session.add_items([call, output]))  # type: ignore[list-item]
    items = run(session.get_items())
    assert items[1] == call
    assert items[2]["type"] == "function_call_output" and items[2]["call_id"] == "c1"
    assert len(items[2]["output"]) < len(big) // 2
    stored = recap.export("large").messages
    assert "agents_items" not in stored[-1]
    assert len(json.dumps(stored[-1])) < len(big) // 2


def test_conversation_meta(recap: Recap) -> None:
    """``set_meta`` sets and removes one key, refuses the export format's own keys and values
    that are not JSON, and an unknown conversation is a ``NotFoundError``."""
    from recap.core.errors import InputError, NotFoundError

    recap.new("m")
    assert recap.set_meta("m", "k", [1, "a"]) == {"k": [1, "a"]}
    assert recap.meta("m") == {"k": [1, "a"]}
    assert recap.set_meta("m", "k", None) == {}
    for key in ("id", "messages", ""):
        with pytest.raises(InputError):
            recap.set_meta("m", key, 1)
    with pytest.raises(TypeError):
        recap.set_meta("m", "k", object())
    with pytest.raises(NotFoundError):
        recap.meta("absent")
    assert recap.meta("m") == {}
