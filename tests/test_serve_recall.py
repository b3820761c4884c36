"""`recap serve` with RECAP_SERVE_RECALL=true: the model calls ``recap_recall`` for a cleared
output, serve answers the call itself, the upstream's next request carries the original output,
and the client's reply shows no recall call; the calls answered a turn are bounded.

A real serve process, the real openai SDK as the client, and the stand-in upstream on 127.0.0.1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from recap.core.storage.db import session_scope
from recap.core.storage.models import CLEARINGS
from recap.core.storage.sweep import apply_clearings
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from tests.support.llm_server import LLMServer, Reply
from tests.support.serving import (
    KEY_B,
    SYSTEM,
    Serve,
    as_message,
    new_id,
    running_serve,
    turn,
    wait_until,
)

OUTPUT = "\n".join(f"src/module_{n}.py: def handler_{n}(request): ..." for n in range(60))
TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
MAX_CALLS = 2


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder: Path = tmp_path_factory.mktemp("serve-recall")
    env = {"RECAP_SERVE_RECALL": "true", "RECAP_SERVE_RECALL_MAX_CALLS": str(MAX_CALLS)}
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm, **env) as running:
        yield running


def recall_call(call_id: str, ref: str) -> dict[str, Any]:
    arguments = json.dumps({"ref": ref})
    return {"id": call_id, "type": "function", "function": {"name": "recap_recall",
                                                             "arguments": arguments}}  # fmt: skip


def _cleared_history(serve: Serve, cid: str) -> tuple[list[dict[str, Any]], int]:
    """A stored agent turn whose grep output is then cleared; the history and the result's id."""
    call = {"id": "call_g", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    serve.llm.script(Reply(text="", tool_calls=[call]))
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "find the handlers"}]
    first = turn(serve, cid, messages, tools=TOOLS).parse()
    messages += [as_message(first), {"role": "tool", "tool_call_id": "call_g", "content": OUTPUT}]
    messages.append(as_message(turn(serve, cid, messages, tools=TOOLS).parse()))
    result = next(m for m in serve.branch(cid) if m["role"] == "tool")
    with session_scope(serve.engine) as session:
        plan = ClearingPlan(
            "idle", (PlannedClearing(message_id=result["id"], tokens_reclaimed=100),)
        )
        assert apply_clearings(session, cid, plan).cleared == 1
    return messages, int(result["id"])


def _cleared(serve: Serve, message_id: int) -> bool:
    """Whether a cleared step of the message is recorded."""
    statement = select(CLEARINGS.c.id).where(
        CLEARINGS.c.message_id == message_id, CLEARINGS.c.stage == "cleared"
    )
    with serve.engine.connect() as connection:
        return connection.execute(statement).first() is not None


def test_the_model_recalls_a_cleared_output_through_serve(serve: Serve) -> None:
    """The placeholder names its ref; the model calls recap_recall; serve answers it; the
    upstream's next request carries the original output; the client sees only the answer."""
    cid = new_id()
    messages, result_id = _cleared_history(serve, cid)
    messages.append({"role": "user", "content": "which module has handler_42?"})
    serve.llm.script(Reply(text="", tool_calls=[recall_call("rc_1", f"m{result_id}")]))
    before = len(serve.llm.requests)
    stored_before = len(serve.branch(cid))
    reply = turn(serve, cid, messages, tools=TOOLS).parse()

    asked, answered = (r.body for r in serve.llm.requests[before:])
    assert [t["function"]["name"] for t in asked["tools"]] == ["grep", "recap_recall"]
    placeholder = next(m["content"] for m in asked["messages"] if m["role"] == "tool")
    assert f"ref=m{result_id}" in placeholder and OUTPUT not in placeholder
    recalled = answered["messages"][-1]
    assert recalled["role"] == "tool" and recalled["tool_call_id"] == "rc_1"
    assert OUTPUT in recalled["content"]
    assert answered["messages"][-2]["tool_calls"][0]["function"]["name"] == "recap_recall"

    message = reply.choices[0].message
    assert not message.tool_calls and message.content.startswith("reply to:")
    stored = serve.branch(cid)
    assert len(stored) == stored_before + 2  # the new user message and the final reply
    assert not any("recap_recall" in json.dumps(m) for m in stored)


def test_another_key_recalls_nothing_of_a_conversation_of_the_same_name(serve: Serve) -> None:
    """Key B naming key A's conversation has its own: its model's recall of A's cleared output
    (by A's reference) answers that the message is not in the conversation."""
    cid = new_id()
    _messages, result_id = _cleared_history(serve, cid)
    serve.llm.script(Reply(text="", tool_calls=[recall_call("rc_b", f"m{result_id}")]))
    before = len(serve.llm.requests)
    reply = turn(serve, cid, [SYSTEM, {"role": "user", "content": "recall it"}], key=KEY_B)
    answered = serve.llm.requests[before + 1].body["messages"][-1]
    assert answered["tool_call_id"] == "rc_b" and "not in conversation" in answered["content"]
    assert OUTPUT not in json.dumps(serve.llm.requests[before + 1].body)
    assert "~" not in answered["content"]  # B's conversation named as B named it
    assert reply.parse().choices[0].message.content.startswith("reply to:")


def test_recall_calls_a_turn_are_bounded(serve: Serve) -> None:
    """Past RECAP_SERVE_RECALL_MAX_CALLS answers the next round goes out without the tool, and
    a call over the limit is told so."""
    cid = new_id()
    messages, result_id = _cleared_history(serve, cid)
    messages.append({"role": "user", "content": "again"})
    ref = f"m{result_id}"
    serve.llm.script(
        Reply(text="", tool_calls=[recall_call("a", ref)]),
        Reply(text="", tool_calls=[recall_call("b", ref), recall_call("c", ref)]),
    )
    before = len(serve.llm.requests)
    reply = turn(serve, cid, messages, tools=TOOLS).parse()
    rounds = [r.body for r in serve.llm.requests[before:]]
    assert len(rounds) == 3
    assert "recap_recall" not in json.dumps(rounds[-1]["tools"])
    last = rounds[-1]["messages"]
    assert OUTPUT in last[-2]["content"] and "limit" in last[-1]["content"]
    assert not reply.choices[0].message.tool_calls


def test_a_streamed_turn_goes_out_as_it_is(serve: Serve) -> None:
    """A streamed turn is not given the tool (its reply is relayed as it comes)."""
    cid = new_id()
    before = len(serve.llm.requests)
    stream = serve.client().chat.completions.create(
        model="openai/stand-in",
        messages=[SYSTEM, {"role": "user", "content": "hello"}],
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"X-Recap-Conversation": cid},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.startswith("reply to:")
    (sent,) = (r.body for r in serve.llm.requests[before:])
    assert [t["function"]["name"] for t in sent["tools"]] == ["grep"]


@pytest.mark.redis
@pytest.mark.slow  # the recall through serve runs in the suite on the cleared output below
def test_a_result_a_real_worker_cleared_is_recalled_through_serve(
    llm: LLMServer, tmp_path: Path, private_redis_db: str
) -> None:
    """The whole loop with a real `recap worker`: an agent turn through serve, the worker's
    idle sweep (sent on the broker, as beat sends it) clears the tool output, the model calls
    ``recap_recall`` for it, serve answers the call, the upstream's next request carries the
    original output and the client's reply shows no recall call."""
    from recap.workers.enqueue import producer_app
    from recap.workers.queues import MAINTENANCE_QUEUE
    from tests.support.worker_stack import WorkerProcess, worker_env

    url = f"sqlite:///{tmp_path / 'recap.db'}"
    idle = {"RECAP_IDLE_MINUTES": "0.001", "RECAP_IDLE_KEEP_TOOL_RESULTS": "0",
            "RECAP_CLEAR_AT_LEAST_TOKENS": "0"}  # fmt: skip
    broker = {"RECAP_BROKER_URL": private_redis_db}
    env = {"RECAP_SERVE_RECALL": "true", **broker, **idle}
    with running_serve(url, tmp_path / "serve", llm, **env) as serve:
        worker_environment = worker_env(RECAP_DATABASE_URL=url, **broker, **idle)
        queues = ("--queues", f"compress,{MAINTENANCE_QUEUE}")
        worker = WorkerProcess(worker_environment, tmp_path / "worker.log", queues).start()
        try:
            cid = new_id()
            call = {"id": "call_g", "type": "function",
                    "function": {"name": "grep", "arguments": "{}"}}  # fmt: skip
            llm.script(Reply(text="", tool_calls=[call]))
            messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "find them"}]
            messages.append(as_message(turn(serve, cid, messages, tools=TOOLS).parse()))
            tool = {"role": "tool", "tool_call_id": "call_g", "name": "grep", "content": OUTPUT}
            messages.append(tool)
            messages.append(as_message(turn(serve, cid, messages, tools=TOOLS).parse()))
            result_id = next(m["id"] for m in serve.branch(cid) if m["role"] == "tool")

            sender = producer_app(private_redis_db)  # the app beat and the CLI send with

            def swept() -> bool:  # sent again until it clears, as beat sends it every few minutes
                if _cleared(serve, result_id):
                    return True
                sender.send_task("recap.sweep_idle_tool_results", queue=MAINTENANCE_QUEUE)
                time.sleep(1)
                return False

            wait_until(swept, what="the worker's sweep")

            messages.append({"role": "user", "content": "which module has handler_42?"})
            llm.script(Reply(text="", tool_calls=[recall_call("rc_w", f"m{result_id}")]))
            before = len(llm.requests)
            reply = turn(serve, cid, messages, tools=TOOLS).parse()
            asked, answered = (r.body for r in llm.requests[before:])
            placeholder = next(m["content"] for m in asked["messages"] if m["role"] == "tool")
            assert f"ref=m{result_id}" in placeholder and OUTPUT not in placeholder
            assert OUTPUT in answered["messages"][-1]["content"]
            assert not reply.choices[0].message.tool_calls
            assert not any("recap_recall" in json.dumps(m) for m in serve.branch(cid))
        finally:
            worker.stop()
