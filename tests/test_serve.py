"""`recap serve` as a real process, driven by the official `openai` client (and the npm package
when Node.js can install it), with the local OpenAI-compatible server as the upstream model.

The pure parts (the content hash, the prefix walk, the per-conversation locks) are checked with
tables of plain values first.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from recap.core.errors import InputError
from recap.core.request.prefix import longest_stored_prefix, open_calls, split_system
from recap.core.storage.hashing import message_hash
from recap.core.storage.requests import SeenRequests, checked_and_hashed, known_path
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.workers.serve import direct, upstream
from recap.workers.serve.locks import ConversationLocks
from tests.support.llm_server import LLMServer, Reply
from tests.support.serving import (
    BODY_LIMIT,
    KEY_A,
    KEY_B,
    MODEL,
    SYSTEM,
    UPSTREAM_KEY,
    Serve,
    as_message,
    new_id,
    reply_to,
    running_serve,
    runs,
    turn,
    wait_until,
)

# --- the pure parts ----------------------------------------------------------------------------

CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"role": "user", "content": "hi"}, {"role": "user", "content": "hi", "id": 7}),
        (
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "assistant", "content": "", "tool_calls": [{**CALL, "type": None}]},
        ),
        (
            {"role": "assistant", "content": "ok"},
            {"role": "assistant", "content": "ok", "refusal": None, "annotations": []},
        ),
        (
            {"role": "assistant", "content": "ok"},
            {"role": "assistant", "content": "ok", "reasoning_content": "thought"},
        ),
        (
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}},
                ],
            },
        ),
    ],
)
def test_hash_ignores_what_clients_add(left: dict[str, Any], right: dict[str, Any]) -> None:
    """Two spellings of one message (as SDKs resend it) share one hash."""
    assert message_hash(left) == message_hash(right)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"role": "user", "content": "hi"}, {"role": "user", "content": "hi "}),
        ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}),
        (
            {"role": "tool", "content": "x", "tool_call_id": "a"},
            {"role": "tool", "content": "x", "tool_call_id": "b"},
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**CALL, "function": {"name": "ls", "arguments": '{"a":1}'}}],
            },
        ),
        ({"role": "user", "content": "hi", "name": "ann"}, {"role": "user", "content": "hi"}),
    ],
)
def test_hash_tells_different_messages_apart(left: dict[str, Any], right: dict[str, Any]) -> None:
    """Any change in what a message says changes its hash."""
    assert message_hash(left) != message_hash(right)


# A tree: 1 -> 2 -> 3 -> 4, 2 -> 5 (an edit of 3), and 6 under a stored system root 9.
NODES = [
    (1, None, "a"),
    (2, 1, "b"),
    (3, 2, "c"),
    (4, 3, "d"),
    (5, 2, "x"),
    (9, None, "s"),
    (6, 9, "a"),
]


@pytest.mark.parametrize(
    ("hashes", "starts", "expected"),
    [
        (["a", "b", "c", "d"], [None], [1, 2, 3, 4]),
        (["a", "b", "c", "d", "e"], [None], [1, 2, 3, 4]),
        (["a", "b", "x", "y"], [None], [1, 2, 5]),
        (["a", "b", "y"], [None], [1, 2]),
        (["z", "b"], [None], []),
        (["b", "c"], [None], []),
        ([], [None], []),
        (["a", "b"], [None, 9], [1, 2]),
        (["a"], [None, 9], [6]),
        (["a", "q"], [9], [6]),
    ],
)
def test_longest_stored_prefix(
    hashes: list[str], starts: list[int | None], expected: list[int]
) -> None:
    """The longest stored path repeated by the request, from a root or a stored system prompt;
    among equally long ones the newest."""
    assert longest_stored_prefix(NODES, hashes, starts) == expected


def test_longest_prefix_against_a_reference() -> None:
    """Seeded random trees: the walk equals checking every stored path from the root."""
    import random

    rng = random.Random(15)
    for _ in range(300):
        nodes: list[tuple[int, int | None, str | None]] = []
        for node_id in range(1, rng.randint(1, 25)):
            parent = rng.choice([None, *[n[0] for n in nodes]]) if nodes else None
            nodes.append((node_id, parent, rng.choice("abc")))
        hashes = [rng.choice("abc") for _ in range(rng.randint(0, 8))]
        assert longest_stored_prefix(nodes, hashes, [None]) == _reference(nodes, hashes)


def _reference(nodes: list[tuple[int, int | None, str | None]], hashes: list[str]) -> list[int]:
    parent = {n[0]: n[1] for n in nodes}
    digest = {n[0]: n[2] for n in nodes}
    best: list[int] = []
    for node in parent:
        path = [node]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])  # type: ignore[arg-type]
        path.reverse()
        if len(path) > len(hashes):
            continue
        repeated = all(digest[n] == h for n, h in zip(path, hashes[: len(path)], strict=True))
        longer = len(path) > len(best) or (len(path) == len(best) and path[-1] > best[-1])
        if repeated and longer:
            best = path
    return best


@pytest.mark.parametrize(
    ("messages", "system", "rest"),
    [
        ([{"role": "user", "content": "u"}], None, 1),
        ([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "s", 1),
        (
            [
                {"role": "system", "content": "s"},
                {"role": "developer", "content": [{"type": "text", "text": "d"}]},
                {"role": "user", "content": "u"},
                {"role": "system", "content": "later"},
            ],
            "s\n\nd",
            2,
        ),
    ],
)
def test_split_system(messages: list[dict[str, Any]], system: str | None, rest: int) -> None:
    """Leading system and developer messages are the request's prompt; the rest is history."""
    prompt, history = split_system(messages)
    assert (prompt, len(history)) == (system, rest)


def test_open_calls() -> None:
    """Calls made and not answered."""
    messages = [
        {"role": "assistant", "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"},
    ]
    assert open_calls(messages) == {"call_2"}


def test_resent_history_reuses_only_what_it_repeats() -> None:
    """Checks and hashes are reused for the messages equal to the last request's, from the first
    on: the result is the same as computing them afresh, an edited message and everything after
    it is hashed anew, and a bad message past the repeated part is still refused."""
    first = [
        {"role": "user", "content": "fix the test"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "1 failed"},
    ]
    seen = checked_and_hashed(first, None)
    assert seen.hashes == [message_hash(m) for m in seen.checked]
    edited = [json.loads(json.dumps(first[0])), {"role": "assistant", "content": "no"}]
    again = checked_and_hashed([*edited, {"role": "user", "content": "then?"}], seen)
    fresh = checked_and_hashed([*edited, {"role": "user", "content": "then?"}], None)
    assert again == fresh and again.hashes[0] == seen.hashes[0]
    with pytest.raises(InputError, match="message 3: tool result"):
        checked_and_hashed([*first, {"role": "tool", "tool_call_id": "nope", "content": "x"}], seen)
    cache = SeenRequests(size=2)
    for key in ("a", "b", "c"):
        cache.put(("owner", key), seen)
    assert len(cache) == 2 and cache.get(("owner", "a")) is None
    assert cache.get(("other", "c")) is None and cache.get(("owner", "c")) is seen


def test_known_path_reuses_the_last_turns_ids() -> None:
    """The ids of what the last request stored: the messages repeated, then the reply stored
    after them when the request repeats that too; nothing past an edit or a different reply."""
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    reply = {"role": "assistant", "content": "r"}
    last = replace(
        checked_and_hashed(messages, None), path=(10, 11), reply=(message_hash(reply), 12)
    )
    follow = [*messages, reply, {"role": "user", "content": "c"}]
    assert known_path(checked_and_hashed(follow, None), last) == [10, 11, 12]
    other = [*messages, {"role": "assistant", "content": "x"}]
    assert known_path(checked_and_hashed(other, None), last) == [10, 11]
    edited = [messages[0], {"role": "assistant", "content": "B"}, reply]
    assert known_path(checked_and_hashed(edited, None), last) == [10]
    assert known_path(checked_and_hashed(follow, None), None) == []


def test_a_direct_stream_builds_the_whole_reply() -> None:
    """Text, reasoning and a tool call's arguments joined from their pieces; the usage kept."""
    deltas = [
        {"role": "assistant", "reasoning_content": "think"},
        {"content": "he"},
        {"content": "llo"},
        {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "ls", "arguments": '{"d'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]},
    ]
    chunks = [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    built = direct.build_from_chunks([direct.Chunk(b"", c) for c in chunks])
    assert upstream.reply_message(built) == {
        "role": "assistant",
        "content": "hello",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"d": 1}'}}
        ],
        "reasoning_content": "think",
    }
    assert upstream.usage_of(built) == (5, 2, 0)


def test_conversation_locks_serialize_and_are_dropped() -> None:
    """One holder per conversation at a time, others independent; no lock kept once unused."""

    async def scenario() -> list[str]:
        locks = ConversationLocks()
        order: list[str] = []

        async def hold(cid: str, tag: str, pause: float) -> None:
            await locks.acquire(cid)
            try:
                order.append(f"{tag}+")
                await asyncio.sleep(pause)
                order.append(f"{tag}-")
            finally:
                locks.release(cid)

        await asyncio.gather(hold("c", "a", 0.05), hold("c", "b", 0), hold("d", "x", 0))
        assert len(locks) == 0
        return order

    order = asyncio.run(scenario())
    assert order.index("a-") < order.index("b+")
    assert order.index("x+") < order.index("a-")


# --- a real serve process ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """One serve process on SQLite for the tests that only need distinct conversations."""
    folder = tmp_path_factory.mktemp("serve")
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm) as running:
        yield running


def test_non_streaming_turn_is_stored(either: Serve) -> None:
    """A named conversation: history and reply stored, usage recorded, Recap's request sent."""
    serve = either
    cid = new_id()
    before = len(serve.llm.requests)
    raw = turn(serve, cid, [SYSTEM, {"role": "user", "content": "hello"}])
    reply = raw.parse()
    assert raw.headers["x-recap-mode"] == "stored"
    assert raw.headers["x-recap-conversation"] == cid
    assert reply.choices[0].message.content == reply_to(
        {"messages": [{"role": "user", "content": "hello"}]}
    )
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    sent = serve.llm.requests[before]
    assert sent.messages == [SYSTEM, {"role": "user", "content": "hello"}]
    headers = {k.lower(): v for k, v in sent.headers.items()}
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert headers["user-agent"].startswith("recap-serve") == (serve.path == "direct")
    assert [(m["role"], m["content"]) for m in serve.branch(cid)] == [
        ("user", "hello"),
        ("assistant", reply.choices[0].message.content),
    ]
    assert serve.usage(cid) == [(reply.usage.prompt_tokens, reply.usage.completion_tokens)]


def test_streaming_turn_passes_chunks_and_stores_the_reply(either: Serve) -> None:
    """Chunks arrive one by one; the assembled reply is stored with its usage."""
    serve = either
    cid = new_id()
    messages = [{"role": "user", "content": "stream please"}]
    stream = serve.client().chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Recap-Conversation": cid},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 2
    assert text == reply_to({"messages": messages})
    assert chunks[-1].usage is not None
    wait_until(lambda: serve.count(cid) == 2, what="the streamed reply stored")
    assert serve.branch(cid)[-1]["content"] == text
    wait_until(lambda: len(serve.usage(cid)) == 1, what="usage recorded")


def test_streaming_without_usage_sends_no_usage_chunk(serve: Serve) -> None:
    """A client that did not ask for usage gets none (Recap asks upstream for itself)."""
    stream = serve.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "no usage"}],
        stream=True,
        extra_headers={"X-Recap-Conversation": new_id()},
    )
    chunks = list(stream)
    assert chunks and all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_same_request_twice_stores_nothing_twice(serve: Serve) -> None:
    """A retried request maps onto what is stored: no message, and no reply, twice."""
    cid = new_id()
    messages = [SYSTEM, {"role": "user", "content": "once"}]
    turn(serve, cid, messages)
    turn(serve, cid, messages)
    assert serve.count(cid) == 2


def test_full_history_resent_is_stored_once(serve: Serve) -> None:
    """A client resending its whole history each turn stores each message once, in order."""
    cid = new_id()
    messages: list[dict[str, Any]] = [SYSTEM]
    for n in range(5):
        messages.append({"role": "user", "content": f"question {n}"})
        messages.append(as_message(turn(serve, cid, messages).parse()))
    stored = serve.branch(cid)
    assert [m["content"] for m in stored] == [m["content"] for m in messages[1:]]
    assert serve.count(cid) == 10


def test_tool_calling_agent_loop(either: Serve) -> None:
    """Call, result, answer: the calls and results are stored and sent back paired."""
    serve = either
    cid = new_id()
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    call = {
        "id": "call_read_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "src/app.py"}'},
    }
    serve.llm.script(Reply(text="", tool_calls=[call]))
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "what is in src/app.py?"}]
    first = turn(serve, cid, messages, tools=tools).parse()
    assert first.choices[0].message.tool_calls[0].id == "call_read_1"
    messages.append(as_message(first))
    messages.append({"role": "tool", "tool_call_id": "call_read_1", "content": "print('hi')"})
    before = len(serve.llm.requests)
    final = turn(serve, cid, messages, tools=tools).parse()
    sent = serve.llm.requests[before].body
    assert sent["tools"] == tools
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent["messages"][2]["tool_calls"][0]["id"] == "call_read_1"
    stored = serve.branch(cid)
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1]["tool_calls"][0]["function"]["arguments"] == '{"path": "src/app.py"}'
    assert stored[-1]["content"] == final.choices[0].message.content


def test_streamed_tool_call_and_reasoning_are_stored(serve: Serve) -> None:
    """A streamed reply's tool call (arguments in pieces) and reasoning are stored whole."""
    cid = new_id()
    call = {
        "id": "call_s",
        "type": "function",
        "function": {"name": "ls", "arguments": '{"d": "."}'},
    }
    serve.llm.script(Reply(text="looking", tool_calls=[call], reasoning="list first"))
    stream = serve.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "list"}],
        stream=True,
        extra_headers={"X-Recap-Conversation": cid},
    )
    list(stream)
    wait_until(lambda: serve.count(cid) == 2, what="the streamed reply stored")
    stored = serve.branch(cid)[-1]
    assert stored["tool_calls"][0]["function"]["arguments"] == '{"d": "."}'
    assert stored["reasoning_content"] == "list first"


def test_an_edited_message_starts_a_branch(serve: Serve) -> None:
    """Editing an earlier message branches from its parent; the old branch stays whole."""
    cid = new_id()
    messages: list[dict[str, Any]] = [SYSTEM]
    for n in range(3):
        messages.append({"role": "user", "content": f"step {n}"})
        messages.append(as_message(turn(serve, cid, messages).parse()))
    rows = serve.rows(cid)
    edited = [SYSTEM, *messages[1:3], {"role": "user", "content": "step 1, said otherwise"}]
    reply = turn(serve, cid, edited).parse()
    after = serve.rows(cid)
    assert len(after) == len(rows) + 2
    new_user, new_reply = after[-2], after[-1]
    assert new_user[1] == rows[1][0]  # under the first reply
    assert new_user[3] == "step 1, said otherwise"
    assert new_reply[3] == reply.choices[0].message.content
    assert serve.branch(cid)[:2] == [
        {"id": rows[0][0], "role": "user", "content": "step 0"},
        {"id": rows[1][0], "role": "assistant", "content": rows[1][3]},
    ]
    # the first message edited: a new root
    turn(serve, cid, [SYSTEM, {"role": "user", "content": "start over"}])
    roots = [r for r in serve.rows(cid) if r[1] is None]
    assert [r[3] for r in roots] == ["step 0", "start over"]


def test_disconnect_mid_stream_leaves_a_consistent_branch(serve: Serve) -> None:
    """A client gone mid-stream: no partial reply stored, the conversation usable at once."""
    cid = new_id()
    messages = [{"role": "user", "content": "a long answer please " * 3}]
    serve.llm.script(Reply(text=" ".join(f"w{i}" for i in range(120)), chunk_delay=0.05))
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            f"{serve.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {KEY_A}", "X-Recap-Conversation": cid},
            json={"model": MODEL, "messages": messages, "stream": True},
        ) as response,
    ):
        lines = response.iter_lines()
        got = [next(lines) for _ in range(3)]
    assert any(line.startswith("data: {") for line in got)
    reply = turn(serve, cid, messages).parse()  # waits for the first turn's lock to go
    rows = serve.rows(cid)
    assert [r[2] for r in rows] == ["user", "assistant"]
    assert rows[1][3] == reply.choices[0].message.content
    assert serve.branch(cid)[-1]["content"] == reply.choices[0].message.content


def test_wrong_key_is_401_in_openai_format(serve: Serve) -> None:
    """An unknown or missing key: 401, OpenAI's error shape, the key not echoed."""
    cid = new_id()
    with pytest.raises(openai.AuthenticationError) as caught:
        turn(serve, cid, [{"role": "user", "content": "hi"}], key="not-a-valid-key-xyz")
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_api_key"
    assert "not-a-valid-key-xyz" not in json.dumps(body)
    response = httpx.post(f"{serve.base_url}/chat/completions", json={})
    assert response.status_code == 401 and "error" in response.json()
    assert serve.count(cid) == 0


def test_another_keys_conversation_is_out_of_reach(serve: Serve) -> None:
    """Key B can neither read nor extend key A's conversation: conversation ids are scoped
    per key, so B naming it gets a conversation of its own (tests/test_serve_tenancy.py)."""
    cid = new_id()
    turn(serve, cid, [{"role": "user", "content": "mine"}])
    before = len(serve.llm.requests)
    turn(
        serve,
        cid,
        [{"role": "user", "content": "mine"}, {"role": "user", "content": "B"}],
        key=KEY_B,
    )
    assert serve.llm.requests[before].text.count("mine") == 1  # B's own history only
    assert serve.count(cid) == 2


def test_oversized_body_is_413(serve: Serve) -> None:
    """A body over RECAP_SERVE_MAX_BODY_BYTES is refused whole, nothing stored."""
    cid = new_id()
    with pytest.raises(openai.APIStatusError) as caught:
        turn(serve, cid, [{"role": "user", "content": "x" * (BODY_LIMIT + 10)}])
    assert caught.value.status_code == 413
    assert serve.count(cid) == 0


def test_without_a_conversation_the_request_passes_through(serve: Serve) -> None:
    """No conversation named: sent upstream as it came, nothing stored, a header says so."""
    before = len(serve.llm.requests)
    messages = [SYSTEM, {"role": "user", "content": "just once"}]
    raw = turn(serve, None, messages, temperature=0.2)
    assert raw.headers["x-recap-mode"] == "passthrough"
    sent = serve.llm.requests[before].body
    assert sent["messages"] == messages and sent["temperature"] == 0.2


def test_metadata_names_the_conversation(serve: Serve) -> None:
    """The OpenAI `metadata` field works as well as the header."""
    cid = new_id()
    serve.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "by metadata"}],
        metadata={"recap_conversation": cid},
    )
    assert serve.count(cid) == 2


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "api_base": "http://evil",
            },
            "Unrecognized",
        ),
        ({"model": MODEL, "messages": []}, "non-empty"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "api_key": "k"},
            "Unrecognized",
        ),
        (
            {"model": MODEL, "messages": [{"role": "tool", "tool_call_id": "q", "content": "x"}]},
            "answers no",
        ),
        ({"model": "", "messages": [{"role": "user", "content": "x"}]}, "model"),
    ],
)
def test_bad_requests_are_400(serve: Serve, body: dict[str, Any], fragment: str) -> None:
    """Routing arguments are never taken from a client; malformed input is one clear error."""
    cid = new_id()
    response = httpx.post(
        f"{serve.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {KEY_A}", "X-Recap-Conversation": cid},
        json=body,
    )
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]
    assert serve.count(cid) == 0


def test_upstream_errors_never_echo_the_upstream_key(serve: Serve) -> None:
    """A provider that echoes the key: the client sees its status, the key masked."""
    serve.llm.script(Reply(status=401, error=f"Incorrect API key provided: {UPSTREAM_KEY}"))
    with pytest.raises(openai.AuthenticationError) as caught:
        turn(serve, new_id(), [{"role": "user", "content": "hi"}])
    assert UPSTREAM_KEY not in json.dumps(caught.value.body)
    assert UPSTREAM_KEY not in serve.log.read_text()


def test_models_and_health(serve: Serve) -> None:
    """GET /v1/models needs a key; /health answers without one."""
    assert [m.id for m in serve.client().models.list().data] == [MODEL]  # no map: the upstream's
    assert httpx.get(f"{serve.base_url}/models").status_code == 401
    health = httpx.get(serve.base_url.removesuffix("/v1") + "/health").json()
    assert health == {"status": "ok", "compress_worker": False}  # no worker runs here


def test_context_overflow_compresses_once_and_retries(either: Serve) -> None:
    """The provider says the request is too long: Recap summarizes now and sends it again."""
    serve = either
    cid = new_id()
    messages: list[dict[str, Any]] = [SYSTEM]
    for n in range(12):
        words = " ".join(f"topic{n}word{i}" for i in range(60))
        messages.append({"role": "user", "content": f"question {n}: {words}"})
        messages.append({"role": "assistant", "content": f"answer {n}: {words}"})
    messages.append({"role": "user", "content": "and now?"})
    serve.llm.script(
        Reply(status=400, code="context_length_exceeded",
              error="This model's maximum context length is 2000 tokens. Please reduce the "
              "length of the messages.")
    )  # fmt: skip
    before = len(serve.llm.requests)
    reply = turn(serve, cid, messages).parse()
    assert reply.choices[0].message.content
    first, retry = serve.llm.requests[before : before + 2]
    assert retry.text.count(SUMMARY_MESSAGE_PREFIX.strip()[:20]) == 1
    assert len(json.dumps(retry.body)) < len(json.dumps(first.body))


# --- concurrency, on both databases --------------------------------------------------------------


def test_concurrent_requests_for_one_conversation_never_fork(db_url: str, tmp_path: Path) -> None:
    """Requests for one conversation at once are taken in turn: each message stored once."""
    llm = LLMServer(default=reply_to, default_delay=0.2).start()
    try:
        with running_serve(db_url, tmp_path / "serve", llm) as serve:
            cid = new_id()
            messages = [{"role": "user", "content": "together"}]
            errors: list[BaseException] = []

            def one() -> None:
                try:
                    turn(serve, cid, messages)
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [threading.Thread(target=one) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            assert [r[2] for r in serve.rows(cid)] == ["user", "assistant"]
    finally:
        llm.stop()


# --- 40 turns with a real worker -----------------------------------------------------------------


def test_forty_turns_resent_stored_once_and_requests_shrink(tmp_path: Path) -> None:
    """A client resending its whole history for 40 turns: every message stored once, and the
    upstream request shrinks once the worker (a real one, on the file broker) has summarized."""
    from tests.support.serve_worker import serve_with_worker

    url = f"sqlite:///{tmp_path / 'recap.db'}"
    env = {
        "RECAP_DATABASE_URL": url,
        "RECAP_SERVE_MAX_INPUT_TOKENS": "3000",  # small: a dozen turns go over the trigger
        "RECAP_BROKER_URL": "filesystem://",
        "RECAP_BROKER_FOLDER": str(tmp_path / "broker"),
    }
    llm = LLMServer(default=reply_to).start()
    try:
        with serve_with_worker(url, tmp_path, llm, env) as serve:
            cid = new_id()
            messages: list[dict[str, Any]] = [SYSTEM]
            sizes: list[int] = []
            for n in range(40):
                words = " ".join(f"t{n}w{i}" for i in range(40))
                messages.append({"role": "user", "content": f"turn {n}: {words}"})
                before = len(llm.requests)
                messages.append(as_message(turn(serve, cid, messages).parse()))
                sizes.append(len(json.dumps(llm.requests[before].messages)))
                wait_until(lambda n=n: runs(serve, cid) > n, what=f"the worker's run {n}")
            assert serve.count(cid) == 80
            stored = serve.branch(cid)
            assert [m["content"] for m in stored] == [m["content"] for m in messages[1:]]
            marker = SUMMARY_MESSAGE_PREFIX.strip()[:20]
            summarized = [i for i, r in enumerate(llm.requests[-40:]) if marker in r.text]
            assert summarized, "no request carried a summary"
            first = summarized[0]
            assert sizes[first] < sizes[first - 1]
            assert max(sizes[first:]) < max(sizes[:first]) * 1.5
    finally:
        llm.stop()


# --- the npm package -----------------------------------------------------------------------------


NODE_SCRIPT = """
const OpenAI = require("openai");
const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.KEY });
(async () => {
  const reply = await client.chat.completions.create(
    { model: process.env.MODEL, messages: [{ role: "user", content: "from node" }] },
    { headers: { "X-Recap-Conversation": process.env.CONV } },
  );
  const stream = await client.chat.completions.create(
    { model: process.env.MODEL, stream: true,
      messages: [{ role: "user", content: "from node" }, reply.choices[0].message,
                 { role: "user", content: "and streamed" }] },
    { headers: { "X-Recap-Conversation": process.env.CONV } },
  );
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content || "";
  console.log(JSON.stringify({ first: reply.choices[0].message.content, second: text }));
})().catch((error) => { console.error(String(error)); process.exit(1); });
"""


@pytest.fixture(scope="module")
def node_openai(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the official `openai` npm package installed, or a skip saying why."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed")
    folder = tmp_path_factory.mktemp("node")
    done = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--silent", "openai@4"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"npm install openai failed: {done.stderr.strip()[:200]}")
    return folder


def test_the_npm_openai_package_works_the_same(serve: Serve, node_openai: Path) -> None:
    """The official TypeScript/JavaScript client: a stored turn, then a streamed one."""
    cid = new_id()
    script = node_openai / "turn.js"
    script.write_text(NODE_SCRIPT)
    env = {**os.environ, "BASE_URL": serve.base_url, "KEY": KEY_A, "MODEL": MODEL, "CONV": cid}
    done = subprocess.run(
        ["node", str(script)], cwd=node_openai, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["first"] == reply_to({"messages": [{"role": "user", "content": "from node"}]})
    wait_until(lambda: serve.count(cid) == 4, what="both node turns stored")
    assert serve.branch(cid)[-1]["content"] == result["second"]
