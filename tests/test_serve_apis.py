"""`recap serve` speaking the OpenAI Responses API and Anthropic's Messages API, driven by the
official `openai` and `anthropic` packages, with the local OpenAI-compatible server as the
upstream model (called through chat completions, as every model is).

The conversions both ways are checked first with tables of plain values.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.workers.serve import messages_api, response_events, responses_api
from recap.workers.serve.errors import ServeError
from tests.support.llm_server import LLMServer, Reply
from tests.support.processes import free_port
from tests.support.serve_stack import ROOT, serve_process
from tests.support.serving import (
    KEY_A,
    KEY_B,
    MODEL,
    UPSTREAM_KEY,
    Serve,
    new_id,
    reply_to,
    running_serve,
    runs,
    wait_until,
)
from tests.support.worker_stack import WorkerProcess, worker_env

# --- the conversions ---------------------------------------------------------------------------

CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"d": "."}'}}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hi", [{"role": "user", "content": "hi"}]),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}],
            [{"role": "user", "content": "a"}],
        ),
        (
            [
                {"type": "message", "role": "developer", "content": "be brief"},
                {"role": "user", "content": "list"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": "t"}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "looking"}],
                },
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "ls",
                    "arguments": '{"d": "."}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
            ],
            [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": "list"},
                {
                    "role": "assistant",
                    "content": "looking",
                    "reasoning_content": "t",
                    "tool_calls": [CALL],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
            ],
        ),
        (
            [
                {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "b", "arguments": "{}"},
            ],
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "a", "arguments": "{}"},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "b", "arguments": "{}"},
                        },
                    ],
                }
            ],
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "see"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                    ],
                }
            ],
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                }
            ],
        ),
    ],
)
def test_responses_input_as_chat_messages(value: Any, expected: list[dict[str, Any]]) -> None:
    """Strings, messages, function calls and their outputs, reasoning and images."""
    assert responses_api.input_messages(value) == expected


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "m", "input": "x", "api_base": "http://evil"}, "Unrecognized"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "only function tools"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "not supported"),
        ({"model": "", "input": "x"}, "model"),
        ({"model": "m", "input": "x", "background": True}, "Background"),
    ],
)
def test_responses_requests_refused(body: dict[str, Any], fragment: str) -> None:
    """What chat completions cannot carry is one clear 400."""
    with pytest.raises(ServeError) as caught:
        responses_api.chat_request(body)
    assert caught.value.status == 400 and fragment in caught.value.message


def test_responses_parameters_and_tools() -> None:
    """Function tools, tool choice, output cap, format and effort as chat parameters."""
    chat = responses_api.chat_request(
        {
            "model": "m",
            "input": "x",
            "instructions": "sys",
            "tools": [{"type": "function", "name": "ls", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "ls"},
            "max_output_tokens": 50,
            "text": {"format": {"type": "json_object"}},
            "reasoning": {"effort": "low"},
            "temperature": 0.1,
            "truncation": "auto",
        }
    )
    assert chat.params == {
        "tools": [
            {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "ls"}},
        "max_tokens": 50,
        "response_format": {"type": "json_object"},
        "reasoning_effort": "low",
        "temperature": 0.1,
    }
    assert chat.with_system()[0] == {"role": "system", "content": "sys"}


@pytest.mark.parametrize(
    ("conversation", "message_id", "exact"),
    [("c", 1, True), ("conv-42", 123456789, False), ("a:b:ç with spaces", 7, True)],
)
def test_response_ids_round_trip(conversation: str, message_id: int, exact: bool) -> None:
    """A response id names its conversation and message; foreign ids name nothing."""
    value = responses_api.response_id(conversation, message_id, exact=exact)
    assert responses_api.parse_response_id(value) == responses_api.Reference(
        conversation, message_id, exact
    )
    for other in ("resp_abc", "msg_1", responses_api.unstored_id(), "resp_!!"):
        assert responses_api.parse_response_id(other) is None


def test_responses_reply_and_stream_agree() -> None:
    """A reply's items whole, and the stream of the same reply ending in the same response."""
    head = responses_api.Head(id="resp_x", model="m", echo={"instructions": "s"})
    message = {
        "role": "assistant",
        "content": "hello",
        "reasoning_content": "hm",
        "tool_calls": [CALL],
    }
    whole = responses_api.response_object(head, message, (10, 3, 2), "tool_calls")
    assert [i["type"] for i in whole["output"]] == ["reasoning", "message", "function_call"]
    assert whole["output"][1]["content"][0]["text"] == "hello"
    assert whole["output"][2]["arguments"] == '{"d": "."}'
    assert whole["usage"]["input_tokens"] == 10 and whole["usage"]["total_tokens"] == 13
    deltas = [
        {"reasoning_content": "hm"},
        {"content": "hel"},
        {"content": "lo"},
        {
            "tool_calls": [
                {"index": 0, "id": "call_1", "function": {"name": "ls", "arguments": '{"d'}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '": "."}'}}]},
    ]
    events = response_events.ResponseEvents(head)
    out = events.start()
    for delta in deltas:
        out += events.feed({"choices": [{"index": 0, "delta": delta}]})
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    out += events.feed({"choices": [], "usage": usage})
    out += events.finish()
    kinds = [e["type"] for e in out]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    )
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert out[-1]["response"]["output"] == whole["output"]
    assert out[-1]["response"]["usage"] == whole["usage"]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi"}]),
        (
            [
                {"role": "user", "content": [{"type": "text", "text": "ls"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "sig"},
                        {"type": "text", "text": "looking"},
                        {"type": "tool_use", "id": "call_1", "name": "ls", "input": {"d": "."}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "a.py"},
                        {"type": "text", "text": "and?"},
                    ],
                },
            ],
            [
                {"role": "user", "content": "ls"},
                {
                    "role": "assistant",
                    "content": "looking",
                    "tool_calls": [CALL],
                    "reasoning_content": "hm",
                    "thinking_blocks": [{"type": "thinking", "thinking": "hm", "signature": "sig"}],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
                {"role": "user", "content": "and?"},
            ],
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        },
                        {
                            "type": "text",
                            "text": "what is it?",
                            "cache_control": {"type": "ephemeral"},
                        },
                    ],
                }
            ],
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        {"type": "text", "text": "what is it?"},
                    ],
                }
            ],
        ),
    ],
)
def test_anthropic_messages_as_chat_messages(
    messages: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    """Text, image, thinking, tool_use and tool_result blocks."""
    assert messages_api.history(messages) == expected


def test_anthropic_request_parameters() -> None:
    """System blocks, tools, tool choice, stop sequences and a thinking budget."""
    chat = messages_api.chat_request(
        {
            "model": "m",
            "max_tokens": 100,
            "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "ls", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "thinking": {"type": "enabled", "budget_tokens": 4000},
        }
    )
    assert chat.messages[0] == {"role": "system", "content": "a\n\nb"}
    assert chat.params == {
        "max_tokens": 100,
        "stop": ["END"],
        "tools": [
            {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "reasoning_effort": "medium",
    }
    with pytest.raises(ServeError, match="max_tokens"):
        messages_api.chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(ServeError, match="Extra inputs"):
        messages_api.chat_request({"model": "m", "max_tokens": 1, "messages": [], "api_key": "k"})


def test_anthropic_reply_and_stream_agree() -> None:
    """A reply as content blocks, and its stream's events ending with the same stop reason."""
    message = {
        "role": "assistant",
        "content": "hello",
        "reasoning_content": "hm",
        "tool_calls": [CALL],
    }
    whole = messages_api.message_object("msg_1", "m", message, (10, 3, 2), "tool_calls")
    assert [b["type"] for b in whole["content"]] == ["thinking", "text", "tool_use"]
    assert whole["content"][2]["input"] == {"d": "."} and whole["stop_reason"] == "tool_use"
    assert whole["usage"] == {
        "input_tokens": 8,
        "output_tokens": 3,
        "cache_read_input_tokens": 2,
        "cache_creation_input_tokens": 0,
    }
    events = messages_api.MessageEvents(message_id="msg_1", model="m", input_tokens=9)
    out = events.start()
    for delta in [
        {"reasoning_content": "hm"},
        {"content": "hel"},
        {"content": "lo"},
        {
            "tool_calls": [
                {"index": 0, "id": "call_1", "function": {"name": "ls", "arguments": '{"d'}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '": "."}'}}]},
    ]:
        out += events.feed({"choices": [{"index": 0, "delta": delta}]})
    out += events.finish()
    kinds = [e["type"] for e in out]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    json_parts = [
        e["delta"]["partial_json"]
        for e in out
        if e.get("delta", {}).get("type") == "input_json_delta"
    ]
    assert json.loads("".join(json_parts)) == {"d": "."}
    assert out[-2]["delta"]["stop_reason"] == "tool_use"
    assert out[0]["message"]["usage"]["input_tokens"] == 9


def test_tool_arguments_are_written_one_way() -> None:
    """A stored reply's arguments are those of the input the client will send back."""
    spaced = {**CALL, "function": {"name": "ls", "arguments": '{"d":"."}'}}
    reply = messages_api.canonical_reply(
        {"role": "assistant", "content": None, "tool_calls": [spaced]}
    )
    sent_back = messages_api.history(
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "call_1", "name": "ls", "input": {"d": "."}}
                ],
            }
        ]
    )
    assert reply["tool_calls"] == sent_back[0]["tool_calls"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
     (413, "request_too_large"), (502, "api_error")],
)  # fmt: skip
def test_anthropic_error_format(status: int, kind: str) -> None:
    """Errors in Anthropic's shape."""
    assert messages_api.error_body(ServeError(status, "m")) == {
        "type": "error",
        "error": {"type": kind, "message": "m"},
    }


# --- a real serve process ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("serve-apis")
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm) as running:
        yield running


def conversation_of(response_id: str) -> str:
    ref = responses_api.parse_response_id(response_id)
    assert ref is not None
    return ref.conversation_id


def roles(serve: Serve, cid: str) -> list[str]:
    return [m["role"] for m in serve.branch(cid)]


def test_responses_create_and_continue(serve: Serve) -> None:
    """responses.create, then previous_response_id alone: the stored conversation continues
    and the upstream gets Recap's assembly of it."""
    client = serve.client()
    first = client.responses.create(model=MODEL, input="first question", instructions="Be brief.")
    assert first.output_text == reply_to(
        {"messages": [{"role": "user", "content": "first question"}]}
    )
    assert first.status == "completed" and first.usage is not None
    cid = conversation_of(first.id)
    before = len(serve.llm.requests)
    second = client.responses.create(
        model=MODEL, input="second question", previous_response_id=first.id
    )
    sent = serve.llm.requests[before].messages
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]  # instructions not kept
    assert sent[1]["content"] == first.output_text and sent[2]["content"] == "second question"
    assert conversation_of(second.id) == cid
    assert roles(serve, cid) == ["user", "assistant", "user", "assistant"]
    # the same continuation again stores nothing twice
    client.responses.create(model=MODEL, input="second question", previous_response_id=first.id)
    assert serve.count(cid) == 4


def test_responses_stream_and_continue(either: Serve) -> None:
    """responses.stream: text deltas, the final response; its id continues the conversation."""
    serve = either
    client = serve.client()
    with client.responses.stream(model=MODEL, input="stream me") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 2 and "".join(deltas) == final.output_text
    cid = conversation_of(final.id)
    wait_until(lambda: serve.count(cid) == 2, what="the streamed reply stored")
    events = list(
        client.responses.create(
            model=MODEL, input="and again", previous_response_id=final.id, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.done" in kinds and "response.output_item.done" in kinds
    wait_until(lambda: serve.count(cid) == 4, what="the second streamed reply stored")
    assert serve.branch(cid)[2]["content"] == "and again"


def test_responses_function_tool_round_trip(either: Serve) -> None:
    """A function call, its output as the next input: stored as a call and its result."""
    serve = either
    tools = [{"type": "function", "name": "read_file", "parameters": {"type": "object",
              "properties": {"path": {"type": "string"}}}}]  # fmt: skip
    call = {"id": "call_rf", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}  # fmt: skip
    serve.llm.script(Reply(text="", tool_calls=[call]))
    client = serve.client()
    first = client.responses.create(model=MODEL, input="read a.py", tools=tools)
    calls = [i for i in first.output if i.type == "function_call"]
    assert calls and calls[0].call_id == "call_rf" and calls[0].arguments == '{"path": "a.py"}'
    before = len(serve.llm.requests)
    final = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": "call_rf", "output": "print(1)"}],
        tools=tools,
    )
    sent = serve.llm.requests[before].body
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
    assert sent["tools"][0]["function"]["name"] == "read_file"
    assert final.output_text
    cid = conversation_of(final.id)
    stored = serve.branch(cid)
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1]["tool_calls"][0]["id"] == "call_rf"


def test_responses_streamed_tool_call(either: Serve) -> None:
    """A streamed function call: argument deltas, the call whole in the final response."""
    serve = either
    call = {
        "id": "call_s",
        "type": "function",
        "function": {"name": "ls", "arguments": '{"d": "."}'},
    }
    serve.llm.script(Reply(text="", tool_calls=[call]))
    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
    with serve.client().responses.stream(model=MODEL, input="list", tools=tools) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    assert final.output[-1].type == "function_call" and final.output[-1].arguments == '{"d": "."}'


def test_responses_store_false_keeps_nothing(serve: Serve) -> None:
    """store: false: answered, nothing stored; it may still continue a stored response."""
    client = serve.client()
    first = client.responses.create(model=MODEL, input="remember this")
    cid = conversation_of(first.id)
    before = len(serve.llm.requests)
    loose = client.responses.create(
        model=MODEL, input="just asking", previous_response_id=first.id, store=False
    )
    assert loose.output_text and responses_api.parse_response_id(loose.id) is None
    assert [m["role"] for m in serve.llm.requests[before].messages] == ["user", "assistant", "user"]
    assert serve.count(cid) == 2
    alone = client.responses.create(model=MODEL, input="nothing kept " + new_id(), store=False)
    assert responses_api.parse_response_id(alone.id) is None


def test_responses_unknown_previous_and_other_key(serve: Serve) -> None:
    """An id Recap did not give, or another key's, is a 404 in OpenAI's format."""
    first = serve.client().responses.create(model=MODEL, input="mine")
    for key, previous in ((KEY_A, "resp_notours"), (KEY_B, first.id)):
        with pytest.raises(openai.NotFoundError) as caught:
            serve.client(key).responses.create(
                model=MODEL, input="x", previous_response_id=previous
            )
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["code"] == "previous_response_not_found"


def test_responses_header_names_the_conversation(serve: Serve) -> None:
    """X-Recap-Conversation names the conversation, the input resent whole each turn."""
    cid = new_id()
    client = serve.client()
    headers = {"X-Recap-Conversation": cid}
    first = client.responses.create(model=MODEL, input="one", extra_headers=headers)
    history: list[Any] = [
        {"role": "user", "content": "one"},
        *[i.model_dump() for i in first.output],
    ]
    history.append({"role": "user", "content": "two"})
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=history, extra_headers=headers
    )
    assert raw.headers["x-recap-conversation"] == cid
    assert roles(serve, cid) == ["user", "assistant", "user", "assistant"]


# --- Anthropic ---------------------------------------------------------------------------------


def anthropic_client(serve: Serve, key: str = KEY_A, cid: str | None = None) -> anthropic.Anthropic:
    headers = {"X-Recap-Conversation": cid} if cid else None
    return anthropic.Anthropic(
        base_url=serve.base_url.removesuffix("/v1"),
        api_key=key,
        max_retries=0,
        timeout=60,
        default_headers=headers,
    )


def test_anthropic_messages_create_stored(serve: Serve) -> None:
    """messages.create with a named conversation: stored, system sent as the system part."""
    cid = new_id()
    client = anthropic_client(serve, cid=cid)
    before = len(serve.llm.requests)
    reply = client.messages.create(
        model=MODEL,
        max_tokens=200,
        system="Be brief.",
        messages=[{"role": "user", "content": "hello"}],
    )
    text = reply.content[0].text
    assert text == reply_to({"messages": [{"role": "user", "content": "hello"}]})
    assert reply.stop_reason == "end_turn" and reply.usage.output_tokens > 0
    sent = serve.llm.requests[before].body
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["max_tokens"] == 200
    assert roles(serve, cid) == ["user", "assistant"]


def test_anthropic_messages_stream(either: Serve) -> None:
    """messages.stream: text deltas and the final message; the reply stored after it."""
    serve = either
    cid = new_id()
    client = anthropic_client(serve, cid=cid)
    with client.messages.stream(
        model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "stream it"}]
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 2
    assert "".join(pieces) == final.content[0].text
    wait_until(lambda: serve.count(cid) == 2, what="the streamed reply stored")
    assert serve.branch(cid)[-1]["content"] == "".join(pieces)


def test_anthropic_tool_use_round_trip(either: Serve) -> None:
    """tool_use, then tool_result: stored as a call and its result, the reply recognized when
    sent back (nothing stored twice)."""
    serve = either
    cid = new_id()
    client = anthropic_client(serve, cid=cid)
    tools = [{"name": "read_file", "description": "read", "input_schema": {"type": "object",
              "properties": {"path": {"type": "string"}}}}]  # fmt: skip
    call = {"id": "toolu_1", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path":"a.py"}'}}  # fmt: skip
    serve.llm.script(Reply(text="", tool_calls=[call]))
    messages: list[Any] = [{"role": "user", "content": "read a.py"}]
    first = client.messages.create(model=MODEL, max_tokens=100, tools=tools, messages=messages)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.input == {"path": "a.py"}
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "x=1"}],
        },
    ]
    final = client.messages.create(model=MODEL, max_tokens=100, tools=tools, messages=messages)
    assert final.content[0].type == "text"
    stored = serve.branch(cid)
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1]["tool_calls"][0]["id"] == "toolu_1"
    assert stored[2]["tool_call_id"] == "toolu_1"


def test_anthropic_count_tokens(serve: Serve) -> None:
    """count_tokens: Recap's count, growing with the request."""
    client = anthropic_client(serve)
    short = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    long = client.messages.count_tokens(
        model=MODEL, system="sys " * 50, messages=[{"role": "user", "content": "hi " * 200}]
    )
    assert 0 < short.input_tokens < long.input_tokens


def test_anthropic_without_conversation_passes_through(serve: Serve) -> None:
    """No conversation named: answered in Anthropic's format, nothing stored; Bearer works."""
    client = anthropic.Anthropic(
        base_url=serve.base_url, auth_token=KEY_A, max_retries=0, timeout=60
    )  # a base URL ending in /v1, as copied from an OpenAI client
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "passing"}]
    )
    assert raw.headers["x-recap-mode"] == "passthrough"
    assert raw.parse().content[0].text


def test_anthropic_errors(serve: Serve) -> None:
    """A wrong key and a bad request, in Anthropic's format."""
    with pytest.raises(anthropic.AuthenticationError) as auth:
        anthropic_client(serve, key="wrong-key-xyz").messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )
    assert isinstance(auth.value.body, dict) and auth.value.body["type"] == "error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        anthropic_client(serve).messages.create(model=MODEL, max_tokens=10, messages=[])
    assert isinstance(bad.value.body, dict)
    assert bad.value.body["error"]["type"] == "invalid_request_error"


# --- every other path --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("POST", "/v1/completions", {}),
        ("POST", "/v1/embeddings", {}),
        ("GET", "/v1/responses", {}),
        ("POST", "/chat/completions", {}),
        ("POST", "/v1/complete", {"anthropic-version": "2023-06-01"}),
    ],
)
def test_unknown_routes_answer_json(
    serve: Serve, method: str, path: str, headers: dict[str, str]
) -> None:
    """Any other path gets a JSON error in its API's format naming the supported endpoints."""
    root = serve.base_url.removesuffix("/v1")
    response = httpx.request(method, root + path, headers=headers, json={})
    assert response.status_code in (404, 405)
    body = response.json()
    error = body["error"]
    assert "POST /v1/responses" in error["message"] and "POST /v1/messages" in error["message"]
    if "anthropic-version" in headers:
        assert body["type"] == "error" and error["type"] == "not_found_error"


# --- outcome headers ---------------------------------------------------------------------------


def test_outcome_headers_on_every_stored_turn(serve: Serve) -> None:
    """A turn that fits says so; one whose history does not fit says what was left out, and
    the server logs one line naming the conversation."""
    client = serve.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "short"}],
        extra_headers={"X-Recap-Conversation": new_id()},
    )
    assert raw.headers["x-recap-truncated"] == "false"
    assert raw.headers["x-recap-dropped-messages"] == "0"
    assert raw.headers["x-recap-summary-id"] == "none"
    assert 0 < int(raw.headers["x-recap-request-tokens"]) < 100
    cid = new_id()
    history: list[Any] = []
    for n in range(60):
        words = " ".join(f"t{n}w{i}" for i in range(60))
        history += [
            {"role": "user", "content": f"q{n} {words}"},
            {"role": "assistant", "content": f"a{n} {words}"},
        ]
    history.append({"role": "user", "content": "and now?"})
    before = len(serve.llm.requests)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=history, extra_headers={"X-Recap-Conversation": cid}
    )
    assert raw.headers["x-recap-truncated"] == "true"
    dropped = int(raw.headers["x-recap-dropped-messages"])
    assert dropped > 0
    assert len(serve.llm.requests[before].messages) < len(history)
    assert int(raw.headers["x-recap-request-tokens"]) <= 8_000
    wait_until(lambda: cid in serve.log.read_text(), what="the truncation logged")
    lines = [
        line for line in serve.log.read_text().splitlines() if cid in line and "truncated" in line
    ]
    assert len(lines) == 1
    streamed = client.responses.with_raw_response.create(
        model=MODEL, input="streamed headers", stream=True
    )
    assert streamed.headers["x-recap-truncated"] == "false"
    assert int(streamed.headers["x-recap-request-tokens"]) > 0
    list(streamed.parse())


# --- start-up ----------------------------------------------------------------------------------


def test_a_missing_database_is_created_and_the_start_is_said(
    tmp_path: Path, llm: LLMServer
) -> None:
    """No database yet: recap serve creates it and says in one line where it listens, what it
    uses, and that no worker answers (warned once, and a field of /health)."""
    folder = tmp_path / "fresh"
    env = {
        "RECAP_DATABASE_URL": f"sqlite:///{folder / 'new' / 'recap.db'}",
        "RECAP_SERVE_KEYS": KEY_A,
        "RECAP_UPSTREAM_API_BASE": llm.url,
        "RECAP_BROKER_FOLDER": str(folder / "broker"),
        "RECAP_LOG_JSON": "true",
    }
    with serve_process(env, folder) as process:
        health = httpx.get(f"http://127.0.0.1:{process.port}/health").json()
        assert health == {"status": "ok", "compress_worker": False}
        lines = [
            json.loads(line)
            for line in process.log.read_text().splitlines()
            if line.startswith("{")
        ]
    started = [line for line in lines if line.get("event") == "serve_started"]
    assert len(started) == 1
    assert started[0]["listen"] == f"http://127.0.0.1:{process.port}"
    assert (
        started[0]["database"].endswith("recap.db")
        and started[0]["compress_worker"] == "none answers"
    )
    assert [line["event"] for line in lines].count("serve_no_worker") == 1
    assert any(line.get("event") == "serve_database_created" for line in lines)
    assert (folder / "new" / "recap.db").is_file()
    assert "Traceback" not in process.log.read_text()


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    """A database that cannot be opened: one line on stderr, a non-zero exit, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "recap.workers.cli", "serve", "--port", str(free_port())],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RECAP_DATABASE_URL": "postgresql+psycopg://recap@127.0.0.1:1/none",
            "RECAP_SERVE_KEYS": KEY_A,
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "database" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- 40 turns kept by previous_response_id, with a real worker ---------------------------------


@pytest.mark.redis
@pytest.mark.slow  # test_serve.py's forty chat turns with a worker run by default
def test_forty_responses_turns_shrink_after_the_worker_summarizes(
    tmp_path: Path, private_redis_db: str
) -> None:
    """A Responses client keeping only the last response id for 40 turns: every turn stored
    once, and the upstream request shrinks once the worker (a real `recap worker`, on Redis)
    has summarized; /health says a worker answers."""
    url = f"sqlite:///{tmp_path / 'recap.db'}"
    broker = {"RECAP_BROKER_URL": private_redis_db}
    llm = LLMServer(default=reply_to).start()
    env = worker_env(RECAP_DATABASE_URL=url, **broker)
    engine = make_engine(url)
    upgrade(engine)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        with running_serve(
            url, tmp_path / "serve", llm, RECAP_SERVE_MAX_INPUT_TOKENS="3000", **broker
        ) as serve:
            health = httpx.get(serve.base_url.removesuffix("/v1") + "/health").json()
            assert health["compress_worker"] is True
            client = serve.client()
            previous: str | None = None
            sizes: list[int] = []
            for n in range(40):
                words = " ".join(f"t{n}w{i}" for i in range(40))
                before = len(llm.requests)
                reply = client.responses.create(
                    model=MODEL, input=f"turn {n}: {words}", previous_response_id=previous
                )
                previous = reply.id
                sizes.append(len(json.dumps(llm.requests[before].messages)))
                cid = conversation_of(reply.id)
                wait_until(lambda n=n, cid=cid: runs(serve, cid) > n, what=f"the worker's run {n}")
            assert serve.count(cid) == 80
            marker = SUMMARY_MESSAGE_PREFIX.strip()[:20]
            summarized = [i for i, r in enumerate(llm.requests[-40:]) if marker in r.text]
            assert summarized, "no request carried a summary"
            first = summarized[0]
            assert sizes[first] < sizes[first - 1]
            assert max(sizes[first:]) < max(sizes[:first]) * 1.5
    finally:
        worker.stop()
        llm.stop()
        engine.dispose()


# --- the npm packages --------------------------------------------------------------------------


NODE_SCRIPT = """
const OpenAI = require("openai");
const Anthropic = require("@anthropic-ai/sdk");
(async () => {
  const openai = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.KEY });
  const first = await openai.responses.create({ model: process.env.MODEL, input: "from node" });
  const second = await openai.responses.create(
    { model: process.env.MODEL, input: "again", previous_response_id: first.id });
  const anthropic = new Anthropic({ baseURL: process.env.ROOT_URL, apiKey: process.env.KEY,
    defaultHeaders: { "X-Recap-Conversation": process.env.CONV } });
  const message = await anthropic.messages.create({ model: process.env.MODEL, max_tokens: 50,
    messages: [{ role: "user", content: "from node too" }] });
  console.log(JSON.stringify({ first: first.output_text, second: second.id,
                               anthropic: message.content[0].text }));
})().catch((error) => { console.error(String(error)); process.exit(1); });
"""


@pytest.fixture(scope="module")
def node_sdks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the official `openai` and `@anthropic-ai/sdk` npm packages, or a skip."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed")
    folder = tmp_path_factory.mktemp("node-sdks")
    done = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--silent", "openai@5", "@anthropic-ai/sdk"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"npm install failed: {done.stderr.strip()[:200]}")
    return folder


def test_the_npm_packages_speak_both_apis(serve: Serve, node_sdks: Path) -> None:
    """The TypeScript/JavaScript clients: a Responses turn continued by its id, a Messages turn."""
    cid = new_id()
    script = node_sdks / "apis.js"
    script.write_text(NODE_SCRIPT)
    env = {
        **os.environ,
        "BASE_URL": serve.base_url,
        "ROOT_URL": serve.base_url.removesuffix("/v1"),
        "KEY": KEY_A,
        "MODEL": MODEL,
        "CONV": cid,
    }
    done = subprocess.run(
        ["node", str(script)], cwd=node_sdks, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["first"] == reply_to({"messages": [{"role": "user", "content": "from node"}]})
    assert serve.count(conversation_of(result["second"])) == 4
    assert result["anthropic"] and roles(serve, cid) == ["user", "assistant"]


def test_count_tokens_counts_what_recap_would_send(serve: Serve) -> None:
    """For a named conversation, count_tokens counts Recap's assembly (older history left out
    to fit the window), not the history as the client holds it: the figure the next turn's
    X-Recap-Request-Tokens says."""
    cid = new_id()
    history: list[Any] = []
    for n in range(60):
        words = " ".join(f"t{n}w{i}" for i in range(60))
        history += [
            {"role": "user", "content": f"q{n} {words}"},
            {"role": "assistant", "content": f"a{n} {words}"},
        ]
    history.append({"role": "user", "content": "and now?"})
    raw = anthropic_client(serve, cid=cid).messages.with_raw_response.create(
        model=MODEL, max_tokens=50, messages=history
    )
    assert raw.headers["x-recap-truncated"] == "true"
    named = anthropic_client(serve, cid=cid).messages.count_tokens(model=MODEL, messages=history)
    whole = anthropic_client(serve).messages.count_tokens(model=MODEL, messages=history)
    again = anthropic_client(serve, cid=cid).messages.with_raw_response.create(
        model=MODEL, max_tokens=50, messages=history
    )  # the same request once more: what it sends is what was counted
    assert named.input_tokens == int(again.headers["x-recap-request-tokens"])
    assert again.headers["x-recap-truncated"] == "true"
    assert whole.input_tokens > named.input_tokens


def test_the_reply_limit_is_capped_to_the_room_the_request_leaves(serve: Serve) -> None:
    """A client max_tokens larger than the window leaves is cut to it upstream, and the
    response says so; a smaller one is passed as it came."""
    client = serve.client()
    cid = new_id()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "short"}],
        max_tokens=10**6,
        extra_headers={"X-Recap-Conversation": cid},
    )
    room = int(raw.headers["x-recap-max-output-tokens"])
    assert raw.headers["x-recap-max-tokens-capped"] == "true" and 0 < room < 10**6
    assert serve.llm.requests[-1].body["max_tokens"] == room
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "again"}],
        max_tokens=5,
        extra_headers={"X-Recap-Conversation": new_id()},
    )
    assert raw.headers["x-recap-max-tokens-capped"] == "false"
    assert serve.llm.requests[-1].body["max_tokens"] == 5


def test_a_secret_in_a_streamed_reply_is_masked_in_every_api(serve: Serve) -> None:
    """The upstream key echoed in a reply's text never reaches a Responses or Messages client
    that streams it, nor the stored reply."""
    leak = f"the key is {UPSTREAM_KEY} ok"
    serve.llm.script(Reply(text=leak))
    with serve.client().responses.stream(
        model=MODEL, input="say it", extra_headers={"X-Recap-Conversation": new_id()}
    ) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert UPSTREAM_KEY not in text and "the key is" in text
    serve.llm.script(Reply(text=leak))
    cid = new_id()
    with anthropic_client(serve, cid=cid).messages.stream(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "say it"}]
    ) as stream:
        said = "".join(stream.text_stream)
    assert UPSTREAM_KEY not in said and "the key is" in said
