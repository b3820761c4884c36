"""A sub-agent's work attached to its parent's conversation through the OpenAI Agents SDK: a
parent agent calls a sub-agent as a tool (``sub_agent_tool``), both on ``RecapSession``, the
real SDK talks to the stand-in model server and a real ``recap worker`` compresses between
turns. The parent's later requests carry the sub-agent's own messages (its tool call and
result included) between the attachment's markers, once, until a summary covers them."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from recap.core.client import Recap
from recap.core.storage.models import ATTACHMENTS, SUMMARIES
from tests.support.frameworks_stack import (
    FrameworkStack,
    carries_summary,
    host_on,
    start_stack,
    tool_call_reply,
    user_text,
)
from tests.support.llm_server import Reply

agents = pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled  # noqa: E402

from recap.integrations.openai_agents import RecapSession, sub_agent_tool  # noqa: E402

WINDOW = 3_000
RESERVE = 400
TURNS = 12
FINDING = "SUBFINDING-7731"  # in the sub-agent's tool result only


@function_tool
def archive(query: str) -> str:
    """Search the archive."""
    return f"{FINDING}: the archive says the invoice total is 4711 EUR"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrameworkStack]:
    running = start_stack(tmp_path_factory.mktemp("agents-attach"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def host(stack: FrameworkStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recap]:
    with host_on(stack, monkeypatch) as host:
        yield host


def _model(url: str) -> tuple[Any, Any]:
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url, api_key="test-key", max_retries=0)
    return agents.OpenAIChatCompletionsModel(model="stand-in", openai_client=client), client


@pytest.mark.slow
def test_parent_requests_carry_the_sub_agents_attached_work(
    stack: FrameworkStack, host: Recap
) -> None:
    tag = uuid.uuid4().hex[:8]
    parent = RecapSession(f"lead-{tag}", recap=host, max_input_tokens=WINDOW)
    sub = RecapSession(f"research-{tag}", recap=host, max_input_tokens=WINDOW, enqueue=False)
    server = stack.server

    async def talk() -> None:
        model, client = _model(server.url)
        try:
            researcher = Agent(
                name="researcher",
                instructions="Search the archive, then answer.",
                model=sub.wrap(model),
                tools=[archive],
            )
            tool = sub_agent_tool(
                researcher,
                parent=parent,
                session=sub,
                tool_name="research",
                tool_description="Ask the researcher.",
            )
            lead = Agent(
                name="lead",
                instructions="Answer briefly; use research when needed.",
                model=parent.wrap(model),
                tools=[tool],
                model_settings=ModelSettings(max_tokens=RESERVE),
            )
            server.script(
                tool_call_reply("call_lead_1", "research", json.dumps({"input": "invoice total"})),
                tool_call_reply("call_sub_1", "archive", json.dumps({"query": "invoice"})),
                Reply(text="The researcher found 4711 EUR."),
                Reply(text="We owe 4711 EUR."),
            )
            await Runner.run(lead, "What do we owe?", session=parent)
            await asyncio.to_thread(stack.wait_runs, parent.session_id, 1)
            for turn in range(TURNS):
                await Runner.run(lead, user_text(turn), session=parent)
                await asyncio.to_thread(stack.wait_runs, parent.session_id, turn + 2)
        finally:
            await client.close()

    first = len(server.requests)
    asyncio.run(talk())
    lead_requests = [
        r for r in server.requests[first:] if "use research" in json.dumps(r.messages[:1])
    ]
    assert len(lead_requests) == TURNS + 2
    attached = [r for r in lead_requests[2:] if FINDING in r.text]
    # the turn after the sub-agent ran carries its work, its own tool call and result included
    after = lead_requests[2]
    assert FINDING in after.text and "Attached: the messages of conversation" in after.text
    calls = [c["function"]["name"] for m in after.messages for c in m.get("tool_calls") or []]
    assert "archive" in calls and "research" in calls
    assert all(r.text.count(f"{FINDING}: the archive") <= 1 for r in lead_requests)
    # as it ages the worker summarizes it with the parent's own turns
    assert host.summaries(parent.session_id), "the worker wrote no summary"
    assert carries_summary(lead_requests[-1])
    assert (
        attached == lead_requests[2 : 2 + len(attached)]
    )  # from the next turn on, until summarized
    last = lead_requests[-1]
    assert FINDING not in last.text and "Attached: the messages" not in last.text
    with host.engine.connect() as connection:
        close = connection.execute(
            select(ATTACHMENTS.c.close_message_id).where(
                ATTACHMENTS.c.conversation_id == parent.session_id
            )
        ).scalar_one()
        texts = connection.execute(
            select(SUMMARIES.c.text, SUMMARIES.c.cutoff_message_id)
            .where(SUMMARIES.c.conversation_id == parent.session_id)
            .order_by(SUMMARIES.c.id)
        ).all()
    # the summary covers the attachment whole, and was made from the sub-agent's own items
    assert texts[0][1] >= close
    assert "archive(" in texts[0][0]
