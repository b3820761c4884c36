"""Native items through the Python API (``recap.native``): a host on the official openai and
anthropic clients stores each reply with its provider items, assembles for the model it calls
and sends the assembled history in the API's own items; against the validating stand-in
(``tests.support.native_upstream``) every sealed item goes back byte for byte to its model,
is left out for another, and nothing is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from recap import native as recap_native
from recap.core.client import Recap
from recap.core.settings import Settings
from tests.support.native_upstream import Running

GPT, GPT_B = "openai/stand-a", "openai/stand-b"
CLAUDE = "anthropic/claude-stand-a"
WINDOW = 200_000


@pytest.fixture(scope="module")
def upstream() -> Iterator[Running]:
    running = Running()
    yield running
    running.stop()


@pytest.fixture
def recap(sqlite_engine: Any, tmp_path: Path) -> Recap:
    return Recap(Settings(output_dir=tmp_path / "outputs", thinking_turns=1000), sqlite_engine)


def test_responses_host_keeps_its_items(recap: Recap, upstream: Running) -> None:
    client = openai.OpenAI(base_url=upstream.url, api_key="k", max_retries=0)
    cid = recap.new(model=GPT, max_input_tokens=WINDOW)
    start = len(upstream.state.requests)
    report = recap_native.Report()
    for turn in range(6):
        model = GPT_B if turn == 3 else GPT
        recap.add(cid, {"role": "user", "content": f"use tool in host turn {turn}"})
        for _step in range(2):  # the call, then the answer after its output
            assembled = recap.assemble(cid, model=model, max_input_tokens=WINDOW)
            _system, items = recap_native.responses_input(assembled.messages, model, report)
            raw = client.responses.with_raw_response.create(
                model=model.split("/")[1], input=items, store=False
            )
            wire = raw.http_response.json()  # the reply as the provider wrote it: exact bytes
            recap.add(cid, recap_native.responses_reply(wire, model))
            call = next((i for i in raw.parse().output if i.type == "function_call"), None)
            if call is None:
                break
            recap.add(cid, {"role": "tool", "tool_call_id": call.call_id, "content": "42"})
    requests = upstream.state.requests[start:]
    assert [r.error for r in requests if r.status != 200] == []
    checked = 0
    for index, request in enumerate(requests):
        for earlier in requests[:index]:
            for item in earlier.made:
                same = earlier.body["model"] == request.body["model"]
                assert (item in request.raw.decode()) == same
                checked += same
    assert checked > 20
    assert report.left_out > 0 and report.sent > 0


def test_anthropic_host_keeps_its_thinking(recap: Recap, upstream: Running) -> None:
    client = anthropic.Anthropic(base_url=upstream.url[: -len("/v1")], api_key="k", max_retries=0)
    cid = recap.new(model=CLAUDE, max_input_tokens=WINDOW)
    start = len(upstream.state.requests)
    thinking: Any = {"type": "enabled", "budget_tokens": 2048}
    for turn in range(4):
        recap.add(cid, {"role": "user", "content": f"use tool in claude turn {turn}"})
        for _step in range(2):
            assembled = recap.assemble(cid, model=CLAUDE, max_input_tokens=WINDOW)
            _system, messages = recap_native.anthropic_input(assembled.messages, CLAUDE)
            reply = client.messages.create(
                model="claude-stand-a", max_tokens=500, messages=messages, thinking=thinking
            )
            recap.add(cid, recap_native.anthropic_reply(reply, CLAUDE))
            use = next((b for b in reply.content if b.type == "tool_use"), None)
            if use is None:
                break
            recap.add(cid, {"role": "tool", "tool_call_id": use.id, "content": "42"})
    requests = upstream.state.requests[start:]
    assert len(requests) == 8
    assert [r.error for r in requests if r.status != 200] == []
    for index in range(1, 8, 2):  # each tool loop's signed thinking went back intact (the
        # SDK's object orders a block's keys its own way: the same JSON, not the same bytes)
        sent = [b for m in requests[index].body["messages"] for b in m["content"]]
        assert json.loads(requests[index - 1].made[0]) in sent


def test_reply_of_another_kind_is_refused_plainly() -> None:
    with pytest.raises(TypeError, match="expected a reply object"):
        recap_native.responses_reply(42, GPT)
