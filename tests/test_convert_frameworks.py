"""The conversions between each framework's message types and Recap's, table-tested both ways
(text, images, tool calls, tool results, reasoning), and each table stored in a real Recap and
assembled back unchanged."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recap.core.client import Recap
from recap.core.settings import Settings
from tests.test_media import png_bytes

pytest.importorskip("agents", reason="the openai-agents extra is not installed")
pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

PNG = png_bytes(4, 3)
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode("ascii")
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
ARGS = json.dumps({"order_id": "A1"})
LC_CALL = {"name": "lookup", "args": {"order_id": "A1"}, "id": "call_1", "type": "tool_call"}
CALL_ARGS = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": ARGS}}


@pytest.fixture
def recap(tmp_path: Path) -> Iterator[Recap]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'convert.db'}", output_dir=tmp_path / "outputs"
    )
    host = Recap(settings, create_schema=True)
    yield host
    host.engine.dispose()


def stored_and_assembled(recap: Recap, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages through Recap's store and assembly (a big window: nothing left out)."""
    cid = recap.new(max_input_tokens=100_000)
    recap.add_many(cid, messages)
    return recap.assemble(cid).messages


# --- the OpenAI Agents SDK -----------------------------------------------------------------------

# (name, items as the SDK stores them, Recap messages, items given back when they differ)
AGENTS_TABLE: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], Any]] = [
    ("text", [{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi"}], None),
    (
        "text parts",
        [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "hi"}],
    ),
    (
        "image",
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": PNG_URL, "detail": "low"},
                ],
            }
        ],
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}},
                ],
            }
        ],
        None,
    ),
    (
        "tool call and result",
        [
            {"role": "user", "content": "where is A1?"},
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "checking", "annotations": []}],
            },
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": ARGS},
            {"type": "function_call_output", "call_id": "call_1", "output": "shipped"},
        ],
        [
            {"role": "user", "content": "where is A1?"},
            {"role": "assistant", "content": "checking", "tool_calls": [CALL_ARGS]},
            {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "shipped"},
        ],
        [
            {"role": "user", "content": "where is A1?"},
            {"role": "assistant", "content": "checking"},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": ARGS},
            {"type": "function_call_output", "call_id": "call_1", "output": "shipped"},
        ],
    ),
    (
        "parallel calls",
        [
            {"role": "user", "content": "both"},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            {"type": "function_call_output", "call_id": "b", "output": "2"},
        ],
        [
            {"role": "user", "content": "both"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "name": "f", "content": "1"},
            {"role": "tool", "tool_call_id": "b", "name": "g", "content": "2"},
        ],
        None,
    ),
    (
        "reasoning",
        [
            {"role": "user", "content": "think"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]},
            {"role": "assistant", "content": "done"},
            {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "u"}]},
            {"role": "assistant", "content": "more"},
        ],
        [
            {"role": "user", "content": "think"},
            {"role": "assistant", "content": "done", "reasoning_content": "t"},
            {"role": "assistant", "content": "more", "reasoning_content": "u"},
        ],
        [
            {"role": "user", "content": "think"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]},
            {"role": "assistant", "content": "done"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "u"}]},
            {"role": "assistant", "content": "more"},
        ],
    ),
    (
        "hosted tool item",
        [
            {"role": "user", "content": "search"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"role": "assistant", "content": "found"},
        ],
        [
            {"role": "user", "content": "search"},
            {
                "role": "assistant",
                "content": "found",
                "openai_items": [{"type": "web_search_call", "id": "ws_1", "status": "completed"}],
            },
        ],
        [
            {"role": "user", "content": "search"},
            {"role": "assistant", "content": "found"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ],
    ),
]


@pytest.mark.parametrize(("name", "items", "messages", "back"), AGENTS_TABLE)
def test_openai_agents_items_both_ways(
    name: str, items: list[dict[str, Any]], messages: list[dict[str, Any]], back: Any
) -> None:
    from recap.convert import openai_agents as convert

    assert convert.items_to_messages(items) == messages
    assert convert.messages_to_items(messages) == (items if back is None else back)


@pytest.mark.parametrize(("name", "items", "messages", "back"), AGENTS_TABLE)
def test_openai_agents_items_through_the_store(
    recap: Recap, name: str, items: list[dict[str, Any]], messages: list[dict[str, Any]], back: Any
) -> None:
    """Stored and assembled: the same items (reasoning is not sent back to an OpenAI model,
    as Recap's reasoning rules say)."""
    from recap.convert import openai_agents as convert

    expected = [i for i in (items if back is None else back) if i.get("type") != "reasoning"]
    assembled = stored_and_assembled(recap, convert.items_to_messages(items))
    assert convert.messages_to_items(assembled) == expected


# --- LangChain -----------------------------------------------------------------------------------


def langchain_table() -> list[tuple[str, Any, dict[str, Any]]]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    return [
        ("text", HumanMessage("hi"), {"role": "user", "content": "hi"}),
        ("system", SystemMessage("be brief"), {"role": "system", "content": "be brief"}),
        (
            "image",
            HumanMessage([{"type": "text", "text": "look"}, image]),
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
        ),
        (
            "tool call",
            AIMessage(
                "checking",
                tool_calls=[LC_CALL],
            ),
            {"role": "assistant", "content": "checking", "tool_calls": [CALL_ARGS]},
        ),
        (
            "tool call without text",
            AIMessage(
                "", tool_calls=[{"name": "lookup", "args": {}, "id": "call_1", "type": "tool_call"}]
            ),
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
        ),
        (
            "tool result",
            ToolMessage("shipped", tool_call_id="call_1", name="lookup"),
            {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "shipped"},
        ),
        (
            "reasoning",
            AIMessage("done", additional_kwargs={"reasoning_content": "t"}),
            {"role": "assistant", "content": "done", "reasoning_content": "t"},
        ),
        (
            "thinking blocks",
            AIMessage(
                [
                    {"type": "thinking", "thinking": "t", "signature": "sig"},
                    {"type": "text", "text": "done"},
                ]
            ),
            {
                "role": "assistant",
                "content": "done",
                "thinking_blocks": [{"type": "thinking", "thinking": "t", "signature": "sig"}],
            },
        ),
    ]


def _lc_plain(message: Any) -> dict[str, Any]:
    """A LangChain message's fields that carry meaning (no ids, no metadata)."""
    fields = {"type": message.type, "content": message.content}
    for key in ("tool_calls", "tool_call_id", "name", "additional_kwargs"):
        value = getattr(message, key, None)
        if value:
            fields[key] = value
    return fields


def test_langchain_messages_both_ways() -> None:
    from recap.convert import langchain as convert

    for name, message, recap_message in langchain_table():
        assert convert.to_recap(message) == recap_message, name
        assert _lc_plain(convert.from_recap(recap_message)) == _lc_plain(message), name


def test_langchain_standard_blocks_become_openai_parts() -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    from recap.convert import langchain as convert

    encoded = base64.b64encode(PNG).decode("ascii")
    message = HumanMessage(
        [
            {"type": "image", "base64": encoded, "mime_type": "image/png"},
            {"type": "image", "url": "https://example.com/a.png"},
        ]
    )
    assert convert.to_recap(message)["content"] == [
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]
    reasoning = AIMessage([{"type": "reasoning", "reasoning": "t"}, {"type": "text", "text": "x"}])
    assert convert.to_recap(reasoning) == {
        "role": "assistant",
        "content": "x",
        "reasoning_content": "t",
    }


def test_langchain_table_through_the_store(recap: Recap) -> None:
    """A conversation of the table's messages, stored and assembled, comes back the same."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from recap.convert import langchain as convert

    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    conversation = [
        HumanMessage([{"type": "text", "text": "look"}, image]),
        AIMessage(
            "checking",
            tool_calls=[LC_CALL],
        ),
        ToolMessage("shipped", tool_call_id="call_1", name="lookup"),
        AIMessage("done"),
    ]
    assembled = stored_and_assembled(recap, convert.to_recap_all(conversation))
    back = convert.from_recap_all(assembled)
    assert [_lc_plain(m) for m in back] == [_lc_plain(m) for m in conversation]


# --- Pydantic AI ---------------------------------------------------------------------------------


def pydantic_table() -> list[tuple[str, list[Any], list[dict[str, Any]]]]:
    from pydantic_ai.messages import (
        BinaryContent,
        ImageUrl,
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    return [
        (
            "text",
            [ModelRequest(parts=[SystemPromptPart("be brief"), UserPromptPart("hi")])],
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        ),
        (
            "images",
            [
                ModelRequest(
                    parts=[
                        UserPromptPart(
                            [
                                "look",
                                BinaryContent(data=PNG, media_type="image/png"),
                                ImageUrl(url="https://example.com/a.png"),
                            ]
                        )
                    ]
                )
            ],
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": PNG_URL}},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                    ],
                }
            ],
        ),
        (
            "tool call and result",
            [
                ModelRequest(parts=[UserPromptPart("where is A1?")]),
                ModelResponse(
                    parts=[
                        TextPart("checking"),
                        ToolCallPart("lookup", args=ARGS, tool_call_id="call_1"),
                    ]
                ),
                ModelRequest(parts=[ToolReturnPart("lookup", "shipped", tool_call_id="call_1")]),
            ],
            [
                {"role": "user", "content": "where is A1?"},
                {"role": "assistant", "content": "checking", "tool_calls": [CALL_ARGS]},
                {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "shipped"},
            ],
        ),
        (
            "reasoning",
            [
                ModelRequest(parts=[UserPromptPart("think")]),
                ModelResponse(parts=[ThinkingPart("t"), TextPart("done")]),
            ],
            [
                {"role": "user", "content": "think"},
                {"role": "assistant", "content": "done", "reasoning_content": "t"},
            ],
        ),
        (
            "anthropic thinking",
            [
                ModelRequest(parts=[UserPromptPart("think")]),
                ModelResponse(
                    parts=[
                        ThinkingPart("t", signature="sig", provider_name="anthropic"),
                        TextPart("done"),
                    ]
                ),
            ],
            [
                {"role": "user", "content": "think"},
                {
                    "role": "assistant",
                    "content": "done",
                    "thinking_blocks": [{"type": "thinking", "thinking": "t", "signature": "sig"}],
                },
            ],
        ),
    ]


IGNORED = {"timestamp", "run_id", "conversation_id", "metadata", "state", "instructions"}


def _without_stamps(value: Any) -> Any:
    """Dicts without timestamps, run stamps and cached identifiers (lazily computed)."""
    if isinstance(value, dict):
        return {
            k: _without_stamps(v)
            for k, v in value.items()
            if k not in IGNORED and k != "_identifier"
        }
    if isinstance(value, list):
        return [_without_stamps(v) for v in value]
    return value


def _pai_plain(messages: list[Any]) -> list[Any]:
    """Pydantic AI messages without their timestamps and run stamps."""
    return [
        (m.kind, [_without_stamps(dataclasses.asdict(part)) for part in m.parts]) for m in messages
    ]


def test_langchain_invalid_tool_call_and_its_answer_through_the_store(recap: Recap) -> None:
    """A call whose arguments did not parse (LangChain's ``invalid_tool_calls``) is stored as
    the model wrote it, so the tool message answering it pairs with it (before, the call was
    dropped and the store refused its answer as a result without a call), and it comes back as
    an invalid tool call with the same arguments."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from recap.convert import langchain as convert

    bad = {"name": "lookup", "args": '{"order": 12', "id": "call_9", "error": "bad JSON"}
    conversation = [
        HumanMessage("where is order 12?"),
        AIMessage(
            "", tool_calls=[LC_CALL], invalid_tool_calls=[{**bad, "type": "invalid_tool_call"}]
        ),
        ToolMessage("shipped", tool_call_id="call_1", name="lookup"),
        ToolMessage("error: the arguments are not JSON", tool_call_id="call_9", status="error"),
        AIMessage("order 12 shipped"),
    ]
    assembled = stored_and_assembled(recap, convert.to_recap_all(conversation))
    back = convert.from_recap_all(assembled)
    assert isinstance(back[1], AIMessage)
    assert [c["id"] for c in back[1].tool_calls] == ["call_1"]
    assert [(c["id"], c["name"], c["args"]) for c in back[1].invalid_tool_calls] == [
        ("call_9", "lookup", '{"order": 12')
    ]
    assert [m.content for m in back[2:]] == [m.content for m in conversation[2:]]


@pytest.mark.parametrize("row", range(len(pydantic_table())))
def test_pydantic_ai_messages_both_ways(row: int) -> None:
    from recap.convert import pydantic_ai as convert

    name, messages, recap_messages = pydantic_table()[row]
    assert convert.to_recap(messages) == recap_messages, name
    assert _pai_plain(convert.from_recap(recap_messages)) == _pai_plain(messages), name


def test_pydantic_ai_table_through_the_store(recap: Recap) -> None:
    from recap.convert import pydantic_ai as convert

    _, messages, _ = pydantic_table()[2]
    assembled = stored_and_assembled(recap, convert.to_recap(messages))
    assert _pai_plain(convert.from_recap(assembled)) == _pai_plain(messages)


# --- the Agents SDK session protocol -------------------------------------------------------------


def _rows(recap: Recap, cid: str) -> int:
    from sqlalchemy import func, select

    from recap.core.storage.models import MESSAGES

    with recap.engine.connect() as connection:
        statement = select(func.count()).where(MESSAGES.c.conversation_id == cid)
        return int(connection.execute(statement).scalar_one())


def test_openai_agents_pop_and_clear_delete_nothing(recap: Recap) -> None:
    """``pop_item`` moves the session back one item and the next ``add_items`` branches there;
    ``clear_session`` starts a new conversation, which a new session object finds again; every
    stored message stays."""
    import asyncio

    from recap.integrations.openai_agents import RecapSession

    session = RecapSession("s-1", recap=recap, enqueue=False, max_input_tokens=100_000)
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "1"}
    answer = {"role": "assistant", "content": "b"}

    async def talk() -> None:
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items([{"role": "user", "content": "a"}])
        await session.add_items([answer, call])
        await session.add_items([output])
        assert await session.get_items() == [{"role": "user", "content": "a"}, answer, call, output]
        assert await session.get_items(limit=1) == [output]  # the SDK's contract: the latest
        assert await session.pop_item() == output
        assert await session.pop_item() == call  # the answer stays, as a message of its own
        assert await session.get_items() == [{"role": "user", "content": "a"}, answer]
        assert await session.pop_item() == answer
        await session.add_items([{"role": "user", "content": "a2"}])
        expected = [{"role": "user", "content": "a"}, {"role": "user", "content": "a2"}]
        assert await session.get_items() == expected
        assert _rows(recap, "s-1") == 5  # a, b+call, output, b again, a2: nothing deleted
        await session.clear_session()
        assert await session.conversation_id() == "s-1~2"
        assert await session.get_items() == []
        again = RecapSession("s-1", recap=recap, enqueue=False)
        assert await again.conversation_id() == "s-1~2"
        await again.add_items([{"role": "user", "content": "fresh"}])
        assert await session.get_items() == [{"role": "user", "content": "fresh"}]
        assert _rows(recap, "s-1") == 5

    asyncio.run(talk())


def test_openai_agents_instructions_and_tools_are_counted_not_sent(recap: Recap) -> None:
    import asyncio

    from recap.integrations.openai_agents import RecapSession

    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    session = RecapSession("s-2", recap=recap, enqueue=False, instructions="Be brief.", tools=tools)

    async def talk() -> list[Any]:
        await session.add_items([{"role": "user", "content": "a"}])
        return await session.get_items()

    assert asyncio.run(talk()) == [{"role": "user", "content": "a"}]
    request = recap.assemble("s-2", system="Be brief.", tools=tools)
    assert request.tokens.system > 0 and request.tokens.tools > 0


def test_langchain_middleware_without_a_thread_says_what_it_needs(recap: Recap) -> None:
    """No ``thread_id`` and no ``conversation_id``: one clear error before any model call."""
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    from recap.integrations.langchain import RecapMiddleware

    model = ChatOpenAI(model="unused", base_url="http://127.0.0.1:9/v1", api_key="unused")
    agent = create_agent(model, [], middleware=[RecapMiddleware(recap=recap, enqueue=False)])
    with pytest.raises(ValueError, match="thread_id"):
        agent.invoke({"messages": [("user", "hi")]})
