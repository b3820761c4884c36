"""`recap serve`'s Responses API against the Open Responses specification's own compliance
tests: its templates (``tests/data/open_responses/compliance_templates.json``) run against a
real `recap serve` on the stand-in model, each streamed and not, every response object and
every streamed event checked strictly against the specification's schemas
(``tests/support/open_responses``); then the objects Recap builds, checked the same way over
seeded random replies and streams.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from recap.workers.serve import response_events, response_objects, responses_api
from recap.workers.serve.errors import ServeError
from tests.support import open_responses as spec
from tests.support.llm_server import LLMServer, Reply
from tests.support.serving import KEY_A, MODEL, Serve, running_serve

WEATHER_CALL = {
    "id": "call_weather_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"location": "San Francisco, CA"}'},
}
TEMPLATE_IDS = [t["id"] for t in spec.templates()]
FUZZ_SEEDS = range(40)  # random replies and streams checked against the schemas


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("open-responses")
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm) as running:
        yield running


def scripted(serve: Serve, template: dict[str, Any]) -> None:
    """The stand-in model calls the template's tool when it offers one (as a model asked about
    the weather with a weather tool would)."""
    if template["request"].get("tools"):
        serve.llm.script(Reply(text="", tool_calls=[WEATHER_CALL]))


# --- the compliance templates on a real recap serve ---------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("template_id", TEMPLATE_IDS)
def test_compliance_template(either: Serve, template_id: str, streaming: bool) -> None:
    """Each template passes as the specification's runner judges it, streamed and not, on
    both upstream paths (direct and litellm): the response (and every event) valid, then the
    template's own validators."""
    serve = either
    template = next(t for t in spec.templates() if t["id"] == template_id)
    assert not spec.errors(spec.component("CreateResponseBody"), spec.request_of(template, MODEL))
    scripted(serve, template)
    result = spec.run_template(serve.base_url, KEY_A, MODEL, template, streaming=streaming)
    assert result.errors == [], json.dumps(result.response, indent=1)[:3000]
    if streaming:
        assert result.sse is not None
        numbers = [e["data"]["sequence_number"] for e in result.sse.events]
        assert numbers == list(range(len(numbers)))
        ids = {e["data"]["response"]["id"] for e in result.sse.events if "response" in e["data"]}
        assert ids == {result.response["id"]}  # one response throughout the stream


def test_tools_are_echoed_as_sent(serve: Serve) -> None:
    """The tools come back as sent, with the fields the schema requires filled in (a tool
    without ``strict`` or ``description`` gets null, never a guess)."""
    tools = [
        {"type": "function", "name": "a", "parameters": {"type": "object"}, "strict": True},
        {"type": "function", "name": "b", "description": "bee"},
    ]
    answer = serve.client().responses.with_raw_response.create(
        model=MODEL, input="tools", tools=tools, temperature=0.2, top_p=0.5
    )
    body = json.loads(answer.text)
    assert spec.response_errors(body) == []
    assert body["tools"] == [
        {"type": "function", "name": "a", "parameters": {"type": "object"}, "strict": True,
         "description": None},
        {"type": "function", "name": "b", "description": "bee", "parameters": None,
         "strict": None},
    ]  # fmt: skip
    assert (body["temperature"], body["top_p"]) == (0.2, 0.5)


def dumped(model: Any) -> Any:
    """What the `openai` client parsed, as JSON (only the fields it was given)."""
    return model.model_dump(mode="json", exclude_unset=True, warnings=False)


def test_official_client_reads_every_field(serve: Serve) -> None:
    """The `openai` client parses the response and its stream; what it parses is what the
    schema validated (no field lost or renamed)."""
    client = serve.client()
    whole = client.responses.create(
        model=MODEL, input="fields", extra_body={"presence_penalty": 0.5}
    )
    assert whole.presence_penalty == 0.5 and whole.completed_at is not None
    sent = next(r.body for r in reversed(serve.llm.requests) if "fields" in json.dumps(r.body))
    assert sent["presence_penalty"] == 0.5  # passed on, not only repeated
    assert spec.response_errors(dumped(whole)) == []
    with client.responses.stream(model=MODEL, input="stream fields") as stream:
        for event in stream:
            assert spec.event_errors(dumped(event)) == []
        final = stream.get_final_response()
    assert final.status == "completed" and final.background is False


# --- the objects Recap builds, over random replies ---------------------------------------


def random_reply(rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Random chat-completions deltas (reasoning, text, tool calls, in any mix) and the whole
    message they add up to."""
    deltas: list[dict[str, Any]] = []
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if rng.random() < 0.4:
        thought = "".join(rng.choice("abc ") for _ in range(rng.randint(1, 30)))
        deltas.append({"reasoning_content": thought})
        message["reasoning_content"] = thought
    if rng.random() < 0.7:
        words = [rng.choice(["hi", "ö", "\n", "{", "ok"]) for _ in range(rng.randint(1, 9))]
        deltas += [{"content": w} for w in words]
        message["content"] = "".join(words)
    calls = []
    for index in range(rng.randint(0, 3)):
        arguments = json.dumps({"n": rng.randint(0, 99)})
        cut = rng.randint(0, len(arguments))
        name, call_id = f"f{index}", f"call_{index}"
        first = {"name": name, "arguments": arguments[:cut]}
        deltas.append({"tool_calls": [{"index": index, "id": call_id, "function": first}]})
        rest = {"arguments": arguments[cut:]}
        deltas.append({"tool_calls": [{"index": index, "function": rest}]})
        function = {"name": name, "arguments": arguments}
        calls.append({"id": call_id, "type": "function", "function": function})
    if calls:
        message["tool_calls"] = calls
    return deltas, message


def random_echo(rng: random.Random) -> dict[str, Any]:
    """A random Responses request's repeated fields, as ``chat_request`` reads them."""
    body: dict[str, Any] = {"model": "m", "input": "x"}
    choices: dict[str, Any] = {
        "instructions": "be brief",
        "temperature": rng.choice([0, 0.7, 2]),
        "top_p": 0.9,
        "presence_penalty": -1.5,
        "frequency_penalty": 1,
        "top_logprobs": 3,
        "max_output_tokens": 64,
        "metadata": {"k": "v"},
        "parallel_tool_calls": False,
        "service_tier": "flex",
        "truncation": "auto",
        "safety_identifier": "user-1",
        "prompt_cache_key": "key-1",
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_object"}, "verbosity": "low"},
        "tool_choice": rng.choice(["auto", "none", "required", {"type": "function", "name": "f"}]),
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    }
    for name, value in choices.items():
        if rng.random() < 0.5:
            body[name] = value
    return responses_api.chat_request(body).echo


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_random_replies_and_streams_are_valid(seed: int) -> None:
    """Every response object and every event Recap builds, whole or streamed, finished,
    cut at the output cap or broken off, is valid, and the stream ends in the whole reply."""
    rng = random.Random(seed)
    deltas, message = random_reply(rng)
    head = responses_api.Head(
        id="resp_fuzz", model="m", echo=random_echo(rng), store=rng.random() < 0.5
    )
    finish = rng.choice(["stop", "length", "tool_calls", None])
    usage = rng.choice([None, (12, 5, rng.randint(0, 12))])
    whole = responses_api.response_object(head, message, usage, finish)
    assert spec.response_errors(whole) == []
    events = response_events.ResponseEvents(head)
    out = events.start()
    for delta in deltas:
        out += events.feed({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    out += events.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if rng.random() < 0.2:
        out += events.failed(ServeError(502, "upstream model error: gone", code="upstream"))
        assert out[-1]["response"]["status"] == "failed"
    else:
        if usage is not None:
            prompt, completion, cached = usage
            out += events.feed({"choices": [], "usage": {
                "prompt_tokens": prompt, "completion_tokens": completion,
                "prompt_tokens_details": {"cached_tokens": cached}}})  # fmt: skip
        out += events.finish()
        assert out[-1]["response"]["output"] == whole["output"]
    for event in out:
        if event["type"] != "error":  # OpenAI's error event: test_the_error_event_is_openais
            assert spec.event_errors(event) == [], event


@pytest.mark.parametrize(
    ("body", "echoed"),
    [
        ({}, {}),
        ({"tools": [{"type": "function", "name": "f"}]},
         {"tools": [{"type": "function", "name": "f", "description": None, "parameters": None,
                     "strict": None}]}),
        ({"text": {"format": {"type": "json_schema", "name": "n", "schema": {}}}},
         {"text": {"format": {"type": "json_schema", "name": "n", "description": None,
                              "schema": {}, "strict": False}}}),
        ({"reasoning": {"effort": "high"}}, {"reasoning": {"effort": "high", "summary": None}}),
        ({"temperature": 0}, {"temperature": 0}),
    ],
)  # fmt: skip
def test_what_a_response_repeats(body: dict[str, Any], echoed: dict[str, Any]) -> None:
    """The request fields a response repeats, and nothing it was not sent."""
    assert response_objects.echo(body) == echoed


def test_defaults_are_the_upstream_defaults() -> None:
    """A request that set nothing gets the values a model uses when none is sent."""
    made = response_objects.resource(
        response_id="resp_x", model="m", created_at=1, echoed={}, store=True, output=[],
        status="in_progress",
    )  # fmt: skip
    assert spec.response_errors(made) == []
    assert (made["temperature"], made["top_p"], made["presence_penalty"]) == (1.0, 1.0, 0.0)
    assert made["completed_at"] is None and made["tool_choice"] == "auto"


def test_the_error_event_is_openais() -> None:
    """The error event of a broken-off stream is OpenAI's (``code``, ``message`` and ``param``
    at the top): the schema's nests them in an ``error`` object, which the `openai` client
    takes for a failed request and raises on, before the ``response.failed`` that follows. That
    member is the one difference; the failed response itself is valid."""
    events = response_events.ResponseEvents(responses_api.Head(id="resp_e", model="m", echo={}))
    error, failed = events.failed(ServeError(502, "gone", code="upstream"))
    schema = spec.component("ErrorStreamingEvent")
    assert spec.errors(schema, error) == ["(root): 'error' is a required property"]
    parsed = openai.types.responses.ResponseErrorEvent.model_validate(error)
    assert (parsed.code, parsed.message) == ("upstream", "gone")
    assert spec.event_errors(failed) == []
    assert failed["response"]["error"] == {"code": "upstream", "message": "gone"}


def test_reasoning_streams_as_the_specification_names_it(serve: Serve) -> None:
    """A reply with reasoning, streamed: ``response.reasoning.delta`` / ``.done`` (the
    specification's names), every event valid, and the `openai` client reads the stream to its
    final response with the reasoning item in it."""
    serve.llm.script(Reply(reasoning="thinking it over"))
    template = {"request": {"input": "why?"}, "validators": ["streamingSchema"]}
    result = spec.run_template(serve.base_url, KEY_A, MODEL, template, streaming=True)
    assert result.errors == [] and result.sse is not None
    kinds = [e["data"]["type"] for e in result.sse.events]
    assert "response.reasoning.delta" in kinds and "response.reasoning.done" in kinds
    serve.llm.script(Reply(reasoning="thinking again"))
    with serve.client().responses.stream(model=MODEL, input="why again?") as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["reasoning", "message"]


def test_the_agents_sdk_runs_on_the_responses_api(serve: Serve) -> None:
    """The OpenAI Agents SDK's Responses model on recap serve: a run and a streamed run reach
    their final output (the SDK parses every response object and event on the way)."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    async def both() -> tuple[str, str]:
        async with AsyncOpenAI(base_url=serve.base_url, api_key=KEY_A, max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
            agent = agents.Agent(name="a", instructions="Be brief.", model=model)
            result = await agents.Runner.run(agent, "hello agents")
            run = agents.Runner.run_streamed(agent, "hello streamed")
            async for _event in run.stream_events():
                pass
            return str(result.final_output), str(run.final_output)

    whole, streamed = asyncio.run(both())
    assert "hello agents" in whole and "hello streamed" in streamed
