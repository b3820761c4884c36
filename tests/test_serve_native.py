"""`recap serve` with native upstream dialects (RECAP_UPSTREAM_DIALECT=native), driven by the
official openai and anthropic clients, against a stand-in upstream that speaks the Responses and
Messages APIs and validates them as the providers do (``tests.support.native_upstream``): a
sealed item changed by one byte, sent to another model or out of its tool loop is refused.

A 30-request reasoning-and-tools conversation sends every encrypted item (and built-in tool
item) back byte for byte to the model that made it, leaves them out for another model, and the
upstream never answers 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.support.native_upstream import Running, Seen, seal
from tests.support.serving import KEY_A as KEY
from tests.support.serving import Serve, running_serve

MODEL_A, MODEL_B = "openai/stand-a", "openai/stand-b"
CLAUDE_A, CLAUDE_B = "anthropic/claude-stand-a", "anthropic/claude-stand-b"
THINKING = {"type": "enabled", "budget_tokens": 2048}


@pytest.fixture(scope="module")
def upstream() -> Iterator[Running]:
    running = Running()
    yield running
    running.stop()


def _serve(upstream: Running, folder: Any, **env: str) -> Any:
    db_url = f"sqlite:///{folder / 'recap.db'}"
    return running_serve(
        db_url,
        folder,
        upstream,
        RECAP_UPSTREAM_DIALECT="native",
        **env,  # type: ignore[arg-type]
    )


WINDOW_TURNS = 3  # RECAP_THINKING_TURNS of the module's serve: this turn and the two before


@pytest.fixture(scope="module")
def serve(upstream: Running, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("native")
    with _serve(upstream, folder, RECAP_THINKING_TURNS=str(WINDOW_TURNS)) as running:
        yield running


def check_items(requests: list[Seen], turns: list[int], window: int) -> int:
    """Every sealed item an earlier reply of the conversation made is in a later request, byte
    for byte, exactly when the rule says: the request is for the model that made it, and the
    item is a built-in tool item or reasoning of a turn within the thinking ``window``; else
    it is absent. The number of items found sent."""
    checked = 0
    for index, request in enumerate(requests):
        sent, model = request.raw.decode(), request.body["model"]
        for earlier in range(index):
            for item in requests[earlier].made:
                reasoning = not item.startswith('{"type":"web_search_call"')
                recent = turns[index] - turns[earlier] < window
                due = requests[earlier].body["model"] == model and (recent or not reasoning)
                assert (item in sent) == due, f"request {index}, item of request {earlier}"
                checked += due
    return checked


# --- the stand-in refuses what a provider refuses ----------------------------------------------


def test_stand_in_refuses_a_changed_item_and_a_block_out_of_its_loop(upstream: Running) -> None:
    client = openai.OpenAI(base_url=upstream.url, api_key="k", max_retries=0)
    first = client.responses.create(model="stand-a", input="use tool please")
    items = [item.model_dump(exclude_none=True) for item in first.output]
    output = {"type": "function_call_output", "call_id": items[1]["call_id"], "output": "1"}
    assert client.responses.create(model="stand-a", input=[*items, output]).output
    changed = json.loads(json.dumps(items))
    text = changed[0]["encrypted_content"]
    changed[0]["encrypted_content"] = text[:5] + ("A" if text[5] != "A" else "B") + text[6:]
    with pytest.raises(openai.BadRequestError, match="invalid_encrypted_content"):
        client.responses.create(model="stand-a", input=[*changed, output])
    with pytest.raises(openai.BadRequestError, match="invalid_encrypted_content"):
        client.responses.create(model="stand-b", input=[*items, output])  # another model's

    claude = anthropic.Anthropic(base_url=upstream.url[: -len("/v1")], api_key="k", max_retries=0)
    asked = [{"role": "user", "content": "use tool one"}]
    one = claude.messages.create(model="c", max_tokens=100, messages=asked, thinking=THINKING)
    blocks = [b.model_dump(exclude_none=True) for b in one.content]
    result = {"type": "tool_result", "tool_use_id": blocks[1]["id"], "content": "1"}
    loop = [*asked, {"role": "assistant", "content": blocks}, {"role": "user", "content": [result]}]
    assert claude.messages.create(model="c", max_tokens=100, messages=loop, thinking=THINKING)
    moved = [{**loop[1], "content": [blocks[1]]}, {"role": "user", "content": [result]}]
    elsewhere = [{"role": "assistant", "content": [blocks[0], {"type": "text", "text": "x"}]}]
    out_of_loop = [asked[0], *elsewhere, {"role": "user", "content": "go on"}, *moved]
    with pytest.raises(anthropic.BadRequestError, match=r"signature|Expected `thinking`"):
        claude.messages.create(model="c", max_tokens=100, messages=out_of_loop, thinking=THINKING)
    without = [asked[0], {"role": "assistant", "content": [blocks[1]]}, loop[2]]
    with pytest.raises(anthropic.BadRequestError, match="Expected `thinking`"):
        claude.messages.create(model="c", max_tokens=100, messages=without, thinking=THINKING)
    assert seal("c", "x") != seal("d", "x")


# --- Responses through serve -------------------------------------------------------------------


def test_thirty_requests_send_every_item_back_to_its_model(serve: Serve, upstream: Running) -> None:
    thirty_requests(serve, upstream, WINDOW_TURNS)


@pytest.mark.slow
def test_thirty_requests_keeping_all_reasoning(
    upstream: Running, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("native-all")
    with _serve(upstream, folder, RECAP_THINKING_TURNS="1000") as keep_all:
        thirty_requests(keep_all, upstream, 1000)


def thirty_requests(serve: Serve, upstream: Running, window: int) -> None:
    """13 tool loops (2 requests each) and 4 web searches, 3 of the 17 turns for another model,
    chained by ``previous_response_id``."""
    client = serve.client()
    start = len(upstream.state.requests)
    previous: str | None = None
    plan = []  # (model, input kind) per user turn: 13 tool loops (2 requests) and 4 searches
    for turn in range(17):
        model = MODEL_B if turn in (4, 5, 12) else MODEL_A
        plan.append((model, "search" if turn % 4 == 3 else "tool"))
    left_out_seen = 0
    for turn, (model, kind) in enumerate(plan):
        text = f"{'search' if kind == 'search' else 'use tool'} in turn {turn}"
        raw = client.responses.with_raw_response.create(
            model=model, input=text, previous_response_id=previous
        )
        reply = raw.parse()
        left_out_seen += int(raw.headers.get("x-recap-provider-items-left-out", "0"))
        previous = reply.id
        if kind == "tool":
            call = next(item for item in reply.output if item.type == "function_call")
            output = {"type": "function_call_output", "call_id": call.call_id, "output": "42"}
            reply = client.responses.create(
                model=model, input=[output], previous_response_id=previous
            )
            assert reply.output_text.startswith("answer")
            previous = reply.id
    requests = upstream.state.requests[start:]
    assert len(requests) == 30
    assert [r.error for r in requests if r.status != 200] == []  # never a 400 upstream
    turns = [n for n, (_m, kind) in enumerate(plan) for _ in range(2 if kind == "tool" else 1)]
    assert check_items(requests, turns, window) > 60
    assert left_out_seen > 0  # the other model's turns said what they left out


def test_streamed_responses_are_stored_with_their_items(serve: Serve, upstream: Running) -> None:
    client = serve.client()
    events = list(client.responses.create(model=MODEL_A, input="use tool streamed", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    call = next(item for item in final.output if item.type == "function_call")
    reasoning = next(item for item in final.output if item.type == "reasoning")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "7"}
    before = len(upstream.state.requests)
    reply = client.responses.create(model=MODEL_A, input=[output], previous_response_id=final.id)
    assert reply.output_text.startswith("answer")
    sent = upstream.state.requests[before]
    assert sent.status == 200
    assert reasoning.encrypted_content in sent.raw.decode()


# --- Messages through serve --------------------------------------------------------------------


def claude_client(serve: Serve, conversation: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=serve.base_url[: -len("/v1")],
        api_key=KEY,
        max_retries=0,
        default_headers={"X-Recap-Conversation": conversation},
    )


def test_messages_keep_the_tool_loop_thinking_intact(serve: Serve, upstream: Running) -> None:
    claude = claude_client(serve, "native-claude-loop")
    history: list[dict[str, Any]] = []
    start = len(upstream.state.requests)
    for turn in range(8):
        model = CLAUDE_B if turn == 5 else CLAUDE_A
        history.append({"role": "user", "content": f"use tool in turn {turn}"})
        first = claude.messages.create(
            model=model, max_tokens=500, messages=history, thinking=THINKING
        )
        blocks = [block.model_dump(exclude_none=True) for block in first.content]
        history.append({"role": "assistant", "content": blocks})
        result = {"type": "tool_result", "tool_use_id": blocks[-1]["id"], "content": "42"}
        history.append({"role": "user", "content": [result]})
        if turn == 7:  # the last loop streamed
            with claude.messages.stream(
                model=model, max_tokens=500, messages=history, thinking=THINKING
            ) as stream:
                second = stream.get_final_message()
        else:
            second = claude.messages.create(
                model=model, max_tokens=500, messages=history, thinking=THINKING
            )
        assert second.content[-1].type == "text"
        history.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in second.content],
            }
        )
    requests = upstream.state.requests[start:]
    assert [r.error for r in requests if r.status != 200] == []  # never a 400 upstream
    assert len(requests) == 16
    check_items(requests, [n // 2 for n in range(16)], WINDOW_TURNS)
    for index in range(1, len(requests), 2):  # each tool loop's thinking went back intact
        assert requests[index - 1].made[0] in requests[index].raw.decode()


def test_a_client_resending_its_whole_input_matches_the_stored_items(
    serve: Serve, upstream: Running
) -> None:
    """No ``previous_response_id``: the client sends every item back itself (with the
    encrypted content it was given); the stored reply's items go up as stored."""
    client = serve.client()
    items: list[Any] = [{"role": "user", "content": "use tool, resending everything"}]
    start = len(upstream.state.requests)
    for step in range(3):
        reply = client.responses.create(model=MODEL_A, input=items)
        items += [item.model_dump(exclude_none=True) for item in reply.output]
        call = next((i for i in reply.output if i.type == "function_call"), None)
        if call is not None:
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "1"})
        else:
            items.append({"role": "user", "content": f"use tool again {step}"})
    requests = upstream.state.requests[start:]
    assert [r.error for r in requests if r.status != 200] == []
    assert check_items(requests, [0, 0, 1], WINDOW_TURNS) >= 2


# --- tracing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["responses", "messages"])
def test_a_native_call_is_a_span_of_the_clients_trace_carried_upstream(
    upstream: Running, tmp_path: Any, dialect: str
) -> None:
    """With ``RECAP_TRACING``, a turn sent in a native dialect has its GenAI CLIENT span under
    the turn's SERVER span, in the client's trace, with the native reply's usage; and the
    request upstream carries that span as its W3C ``traceparent`` (the chat path did; the
    native path sent none)."""
    from tests.support.otlp import collector

    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with collector() as traces, _serve(upstream, tmp_path, **traces.env("recap-serve")) as serve:
        before = len(upstream.state.requests)
        headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
        if dialect == "responses":
            reply = serve.client().responses.create(
                model=MODEL_A, input="hello", extra_headers=headers
            )
            used = reply.usage
            assert used is not None
            tokens = (used.input_tokens, used.output_tokens)
            name, provider, route = "chat stand-a", "openai", "POST /v1/responses"
        else:
            message = claude_client(serve, "native-traced").messages.create(
                model=CLAUDE_A,
                max_tokens=256,
                messages=[{"role": "user", "content": "hello"}],
                extra_headers=headers,
            )
            tokens = (message.usage.input_tokens, message.usage.output_tokens)
            name, provider, route = "chat claude-stand-a", "anthropic", "POST /v1/messages"
        sent = upstream.state.requests[before:]
        assert len(sent) == 1 and sent[0].status == 200
        spans = traces.wait_for(trace_id, {name, route})
    call = next(s for s in spans if s.name == name)
    server = next(s for s in spans if s.name == route)
    assert server.kind == "SERVER" and server.parent_id == parent and call.kind == "CLIENT"
    assert call.trace_id == trace_id
    assert call.attributes["gen_ai.provider.name"] == provider
    assert (
        call.attributes["gen_ai.usage.input_tokens"],
        call.attributes["gen_ai.usage.output_tokens"],
    ) == tokens
    carried = sent[0].headers.get("traceparent", "")
    assert carried.split("-")[1:3] == [trace_id, call.span_id]
