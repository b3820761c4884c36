"""The OpenAI Agents SDK adapter runs the whole host loop: each model call whose request Recap
assembled has the provider's usage recorded against that request, the agent's real system
prompt, tool schemas and output reserve are counted, and a context-length error is answered by
compressing and retrying once. The real SDK talks to the stand-in OpenAI server; the last test
has a real ``recap worker`` compress in the background.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from recap.core.client import Recap
from recap.core.settings import Settings
from recap.core.storage.models import Usage
from tests.support.frameworks_stack import (
    FrameworkStack,
    carries_summary,
    host_on,
    start_stack,
    tool_call_reply,
    user_text,
)
from tests.support.llm_server import LLMServer, Reply

agents = pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled  # noqa: E402

from recap.integrations.openai_agents import RecapSession  # noqa: E402

INSTRUCTIONS = "You are a support agent. " + " ".join(f"rule{i} applies." for i in range(150))
RESERVE = 700  # the agent's max_tokens: the output reserve Recap keeps
WINDOW = 6_000
TURNS = 16
OVERFLOW = "This model's maximum context length is 6000 tokens."


@function_tool
def lookup(order_id: str) -> str:
    """Look up an order by its id."""
    return f"order {order_id}: shipped"


@pytest.fixture(scope="module")
def server() -> Iterator[LLMServer]:
    running = LLMServer(default=lambda body: "answer " + " ".join(["fine"] * 40)).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def recap(sqlite_engine: Any, tmp_path: Path) -> Recap:
    return Recap(Settings(output_dir=tmp_path / "outputs"), sqlite_engine)


CLIENTS: list[Any] = []  # the clients made by a test, closed in the event loop that used them


def _model(url: str, kind: str = "responses") -> Any:
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url, api_key="test-key", max_retries=0)
    CLIENTS.append(client)
    if kind == "responses":
        return agents.OpenAIResponsesModel(model="stand-in", openai_client=client)
    return agents.OpenAIChatCompletionsModel(model="stand-in", openai_client=client)


def talking(coroutine: Any) -> Any:
    """Run the coroutine, then close the test's clients in the same event loop (left open,
    they would be closed later on a loop that is gone)."""

    async def run() -> Any:
        try:
            return await coroutine
        finally:
            while CLIENTS:
                await CLIENTS.pop().close()

    return asyncio.run(run())


def _readings(recap: Recap, cid: str) -> list[Usage]:
    with Session(recap.engine) as session:
        statement = select(Usage).where(Usage.conversation_id == cid).order_by(Usage.id)  # type: ignore[arg-type]
        return list(session.exec(statement))


def _stand_in_input_tokens(body: dict[str, Any]) -> int:
    """What the stand-in server reports as a Responses request's input tokens."""
    return len(json.dumps(body.get("input", ""))) // 4


def test_session_alone_records_each_runs_first_call(server: LLMServer, recap: Recap) -> None:
    """Without the model wrapper, each run's first call (the request the session assembled)
    has its reading recorded against the run's input message; calls after a tool do not."""
    session = RecapSession(f"alone-{uuid.uuid4().hex[:6]}", recap=recap, enqueue=False)
    agent = Agent(name="a", instructions="Be brief.", model=_model(server.url), tools=[lookup])
    first = len(server.requests)

    async def talk() -> None:
        await Runner.run(agent, "hello", session=session)
        server.script(tool_call_reply("c1", "lookup", '{"order_id": "A1"}'))
        await Runner.run(agent, "where is A1?", session=session)
        await Runner.run(agent, "thanks", session=session)

    talking(talk())
    cid = asyncio.run(session.conversation_id())
    readings = _readings(recap, cid)
    requests = server.requests[first:]
    assert len(requests) == 4  # the tool turn calls the model twice
    runs_first = [requests[0], requests[1], requests[3]]
    assert [r.prompt_tokens for r in readings] == [
        _stand_in_input_tokens(r.body) for r in runs_first
    ]
    stored = recap.export(cid).messages
    users = [m["id"] for m in stored if m["role"] == "user"]
    assert [r.leaf_message_id for r in readings] == users
    assert all(r.estimated_tokens > 0 for r in readings)


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_wrapped_model_records_every_call_with_its_fixed_parts(
    server: LLMServer, recap: Recap, kind: str
) -> None:
    """With ``session.wrap(...)`` every call is assembled by Recap and recorded (streamed
    ones too), and the agent's instructions, tools and ``max_tokens`` are counted."""
    session = RecapSession(f"wrapped-{kind}-{uuid.uuid4().hex[:6]}", recap=recap, enqueue=False)
    agent = Agent(
        name="a",
        instructions=INSTRUCTIONS,
        model=session.wrap(_model(server.url, kind)),
        model_settings=ModelSettings(max_tokens=RESERVE),
        tools=[lookup],
    )
    first = len(server.requests)

    async def talk() -> None:
        await Runner.run(agent, "hello", session=session)
        server.script(tool_call_reply("c1", "lookup", '{"order_id": "A1"}'))
        await Runner.run(agent, "where is A1?", session=session)
        if kind == "responses":  # the stand-in reports a chat stream's usage only when asked
            streamed = Runner.run_streamed(agent, "and A2?", session=session)
            async for _event in streamed.stream_events():
                pass

    talking(talk())
    cid = asyncio.run(session.conversation_id())
    requests = server.requests[first:]
    readings = _readings(recap, cid)
    assert len(readings) == len(requests) == (4 if kind == "responses" else 3)
    if kind == "responses":
        assert [r.prompt_tokens for r in readings] == [
            _stand_in_input_tokens(r.body) for r in requests
        ]
    leaves = [r.leaf_message_id for r in readings]
    assert leaves == sorted(leaves) and len(set(leaves)) == len(leaves)
    stats = recap.stats(cid)
    assert stats.output_reserve == RESERVE
    assert stats.fixed > len(INSTRUCTIONS.split())  # the instructions and the tool schema


def test_context_length_error_compresses_and_retries_once(server: LLMServer, recap: Recap) -> None:
    """The provider refuses the request as too long: the conversation is compressed now and
    the call sent again, smaller and with the summary, and the run goes on."""
    session = RecapSession(
        f"overflow-{uuid.uuid4().hex[:6]}", recap=recap, enqueue=False, max_input_tokens=WINDOW
    )
    history: list[Any] = []
    for turn in range(12):
        history += [
            {"role": "user", "content": user_text(turn)},
            {"role": "assistant", "content": f"reply {turn}: " + "noted " * 60},
        ]
    asyncio.run(session.add_items(history))
    agent = Agent(name="a", instructions="Be brief.", model=session.wrap(_model(server.url)))
    refusal = Reply(status=400, error=OVERFLOW, code="context_length_exceeded")
    server.script(refusal)
    first = len(server.requests)
    result = talking(Runner.run(agent, "one more question", session=session))
    assert str(result.final_output).startswith("answer")
    refused, retried = server.requests[first:]
    assert len(retried.messages) < len(refused.messages)
    assert carries_summary(retried) and not carries_summary(refused)
    cid = asyncio.run(session.conversation_id())
    assert recap.summaries(cid)
    assert len(_readings(recap, cid)) == 1  # the retry's reading, against the retried request

    bare = RecapSession(f"bare-{uuid.uuid4().hex[:6]}", recap=recap, enqueue=False)
    server.script(refusal)  # without the wrapper the SDK gets the provider's error as it was
    plain = Agent(name="a", instructions="Be brief.", model=_model(server.url))
    with pytest.raises(Exception, match="maximum context length"):
        talking(Runner.run(plain, "hello", session=bare))


# --- with a worker -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrameworkStack]:
    running = start_stack(tmp_path_factory.mktemp("agents-usage"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def host(stack: FrameworkStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recap]:
    with host_on(stack, monkeypatch) as host:
        yield host


def test_worker_compresses_while_items_keep_their_ids(stack: FrameworkStack, host: Recap) -> None:
    """A wrapped agent talks at a small window while the worker summarizes after each turn:
    the model gets the summary, every call is recorded, and ``get_items`` gives the summary
    followed by the kept items exactly as the SDK stored them (their ``msg_`` ids)."""
    cid = f"agents-usage-{uuid.uuid4().hex[:8]}"
    session = RecapSession(cid, recap=host, max_input_tokens=WINDOW)
    agent = Agent(
        name="a",
        instructions="Answer briefly.",
        model=session.wrap(_model(stack.server.url)),
        model_settings=ModelSettings(max_tokens=RESERVE),
    )
    first = len(stack.server.requests)

    async def talk() -> None:
        for turn in range(TURNS):
            await Runner.run(agent, user_text(turn), session=session)
            await asyncio.to_thread(stack.wait_runs, cid, turn + 1)

    talking(talk())
    requests = stack.server.requests[first:]
    assert host.summaries(cid), "the worker wrote no summary"
    assert carries_summary(requests[-1])
    assert len(_readings(host, cid)) == len(requests) == TURNS
    items = asyncio.run(session.get_items())
    assert str(items[0].get("content", "")).startswith("Summary of the earlier")
    replies = [i for i in items if i.get("type") == "message" and i.get("role") == "assistant"]
    assert replies and all(str(i.get("id", "")).startswith("msg_") for i in replies)
    assert len(items) < 2 * TURNS


@pytest.mark.parametrize(
    ("assembled", "given", "same"),
    [
        (  # a tool output Recap shortened to fit: still the call's output
            {"type": "function_call_output", "call_id": "c1", "output": "head [cut] tail"},
            {"type": "function_call_output", "call_id": "c1", "output": "head middle tail"},
            True,
        ),
        (
            {"type": "function_call_output", "call_id": "c1", "output": "x"},
            {"type": "function_call_output", "call_id": "c2", "output": "x"},
            False,
        ),
        (
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "x"},
            False,
        ),
        ({"role": "user", "content": "hello"}, {"role": "user", "content": "hello"}, True),
        ({"role": "user", "content": "hello"}, {"role": "user", "content": "bye"}, False),
    ],
)
def test_the_input_ends_with_the_assembled_head(
    assembled: dict[str, Any], given: dict[str, Any], same: bool
) -> None:
    """The wrapper sends Recap's assembly when the SDK's input ends with the conversation's
    head: the same call's output counts as the head even when Recap sent it shortened."""
    from recap.integrations._agents_model import _same_item

    assert _same_item(assembled, given) is same


def test_a_handoff_runs_in_the_sessions_conversation(server: LLMServer, recap: Recap) -> None:
    """A handoff hands the run, its session included, to another agent: the items of both
    agents are one conversation, and the agent handed to (its model wrapped by the same
    session) is sent Recap's assembly, its usage recorded, its own instructions counted."""
    session = RecapSession(f"handoff-{uuid.uuid4().hex[:6]}", recap=recap, enqueue=False)
    billing = Agent(
        name="billing",
        instructions="BILLING. " + INSTRUCTIONS,
        model=session.wrap(_model(server.url)),
    )
    triage = Agent(
        name="triage",
        instructions="TRIAGE. Hand billing questions to billing.",
        model=session.wrap(_model(server.url)),
        handoffs=[billing],
    )
    first = len(server.requests)

    async def talk() -> None:
        server.script(tool_call_reply("h1", "transfer_to_billing", "{}"))
        await Runner.run(triage, "why was I charged twice?", session=session)

    talking(talk())
    cid = asyncio.run(session.conversation_id())
    requests = server.requests[first:]
    assert [r.body["instructions"].split(".")[0] for r in requests] == ["TRIAGE", "BILLING"]
    readings = _readings(recap, cid)
    assert len(readings) == 2  # both agents' calls were Recap's requests, both recorded
    stored = recap.export(cid).messages
    assert [m["role"] for m in stored][:1] == ["user"]
    assert any(m.get("tool_calls") for m in stored)  # the handoff call and its result, paired
    assert stored[-1]["role"] == "assistant"
    assert recap.stats(cid).fixed > len(INSTRUCTIONS.split())  # billing's instructions
