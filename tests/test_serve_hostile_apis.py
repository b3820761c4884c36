"""`recap serve`'s Responses and Messages bodies held as strictly as chat completions: every
field checked by one rule, a 4xx in the client's API format for what is wrong, nothing stored
and nothing sent upstream; today's anthropic SDK's parameters accepted (or refused by name);
a hypothesis fuzz of both bodies that never gets a 500; and a differential test holding each
API's verdict on a bad value equal to chat completions' verdict on the same value.

A real serve process in front of a stand-in upstream (``tests.support.hostile_upstream``),
requests as raw HTTP (``tests.support.hostile_api_bodies.send``) and through the official
`anthropic` and `openai` clients.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import pytest
from sqlalchemy import Engine, select

from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import MESSAGES
from tests.support.hostile_api_bodies import Answered, send
from tests.support.hostile_upstream import HostileUpstream
from tests.support.serve_stack import serve_env, serve_process

KEY = "client-key-hostile-apis-2222"
MODEL = "openai/stand-in"
WINDOW = 8_000
PNG = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@dataclass
class Serve:
    base_url: str
    engine: Engine
    upstream: HostileUpstream
    path: str

    def send(self, api: str, body: Any, cid: str | None = None) -> Answered:
        return send(self.base_url, KEY, api, body, cid)

    def rows(self, cid: str) -> int:
        m = MESSAGES.c
        with self.engine.connect() as connection:
            found = connection.execute(select(m.id).where(m.conversation_id == cid)).all()
        return len(found)


def _running(folder: Path, upstream: HostileUpstream, client: str) -> Iterator[Serve]:
    url = f"sqlite:///{folder / 'recap.db'}"
    engine = make_engine(url)
    upgrade(engine)
    env = serve_env(
        url,
        folder,
        keys=KEY,
        upstream=upstream.url,
        upstream_key="sk-upstream-apis-0123456789abcdef",
        window=WINDOW,
        RECAP_UPSTREAM_CLIENT=client,
    )
    try:
        with serve_process(env, folder) as process:
            yield Serve(process.base_url, engine, upstream, client)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def upstream() -> Iterator[HostileUpstream]:
    server = HostileUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def serve_direct(
    upstream: HostileUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    yield from _running(tmp_path_factory.mktemp("apis-direct"), upstream, "direct")


@pytest.fixture(scope="module")
def serve_litellm(
    upstream: HostileUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    yield from _running(tmp_path_factory.mktemp("apis-litellm"), upstream, "litellm")


@pytest.fixture
def serve(serve_direct: Serve) -> Iterator[Serve]:
    yield serve_direct
    serve_direct.upstream.clear()


@pytest.fixture(params=["direct", "litellm"])
def either(request: pytest.FixtureRequest) -> Iterator[Serve]:
    running: Serve = request.getfixturevalue(f"serve_{request.param}")
    yield running
    running.upstream.clear()


def new_id() -> str:
    return f"apis-{uuid.uuid4().hex[:10]}"


def user(text: str = "hello") -> dict[str, Any]:
    return {"role": "user", "content": text}


def _responses(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "hello", **fields}


def _messages(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 50, "messages": [user()], **fields}


def _count(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [user()], **fields}


def _assistant(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [user(), {"role": "assistant", "content": list(blocks)}, user("and?")]


def _image(data: str) -> list[dict[str, Any]]:
    source = {"type": "base64", "media_type": "image/png", "data": data}
    return [{"role": "user", "content": [{"type": "image", "source": source}]}]


def refused(serve: Serve, api: str, body: Any) -> str:
    """The body is a 400 in ``api``'s error format, stored nowhere, sent nowhere (as a stored
    turn and without a conversation alike); the error's message."""
    before = len(serve.upstream.requests)
    message = ""
    for cid in (new_id(), None):
        answer = serve.send(api, body, cid)
        assert answer.status == 400, (api, body, answer.text)
        found = answer.error_message(api)
        assert found, (api, answer.text)
        message = found
        if cid is not None:
            assert serve.rows(cid) == 0
    assert len(serve.upstream.requests) == before, (api, body)
    return message


# --- the rules, pure ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"),
    [(0, True), (0.7, True), (2, True), (2.5, False), (-0.1, False), (True, False),
     ("0.5", False), ("NaN", False), (float("nan"), False), (float("inf"), False),
     (None, False), ([0.5], False)],
)  # fmt: skip
def test_a_number_is_a_finite_json_number_in_range(value: Any, ok: bool) -> None:
    """The temperature rule every API uses: no boolean, no string, nothing non-finite."""
    from recap.workers.serve.errors import ServeError
    from recap.workers.serve.validation.fields import PARAM_CHECKS

    if ok:
        PARAM_CHECKS["temperature"](value, "temperature")
    else:
        with pytest.raises(ServeError, match="temperature"):
            PARAM_CHECKS["temperature"](value, "temperature")


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"input": [{"type": "reasoning", "summary": 5}]}, "input[0].summary"),
        ({"input": [{"type": "reasoning", "summary": [{"text": 5}]}]}, "input[0].summary[0].text"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
         "input[0].content[0].text"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
         "input[0].arguments"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": 1}}},
         "text.format.schema"),
        ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": "x"}]},
         "tools[0].parameters"),
        ({"input": "x", "max_output_tokens": True}, "max_output_tokens"),
        ({"input": "x", "stream": "yes"}, "stream"),
    ],
)  # fmt: skip
def test_responses_rules_name_the_path(body: dict[str, Any], path: str) -> None:
    from recap.workers.serve import responses_api
    from recap.workers.serve.errors import ServeError

    with pytest.raises(ServeError) as caught:
        responses_api.chat_request({"model": "m", **body})
    assert f"`{path}`" in caught.value.message and caught.value.status == 400


@pytest.mark.parametrize(
    ("blocks", "path"),
    [
        ([{"type": "thinking", "signature": "s"}], "messages.1.content.0.thinking"),
        ([{"type": "tool_use", "id": "t", "name": "f", "input": []}], "messages.1.content.0.input"),
        ([{"type": "redacted_thinking", "data": 5}], "messages.1.content.0.data"),
        ([{"type": "text", "text": "x", "cache_control": {"type": "x"}}],
         "messages.1.content.0.cache_control.type"),
    ],
)  # fmt: skip
def test_messages_rules_name_the_path(blocks: list[Any], path: str) -> None:
    """The same wording for /v1/messages and count_tokens (one function)."""
    from recap.workers.serve import messages_api
    from recap.workers.serve.errors import ServeError

    history = [user(), {"role": "assistant", "content": blocks}, user("and?")]
    for count in (False, True):
        body = {"model": "m", "messages": history, **({} if count else {"max_tokens": 5})}
        with pytest.raises(ServeError) as caught:
            messages_api.chat_request(body, count=count)
        assert f"`{path}`" in caught.value.message, caught.value.message


# --- the failures reproduced -------------------------------------------------------------------

REPRODUCED: list[tuple[str, str, Any]] = [
    ("thinking block without its text", "messages",
     _messages(messages=_assistant({"type": "thinking", "signature": "s"}))),
    ("thinking block without its text", "count",
     _count(messages=_assistant({"type": "thinking", "signature": "s"}))),
    ("reasoning summary a number", "responses",
     _responses(input=[{"type": "reasoning", "summary": 5}, user()])),
    ("max_output_tokens negative", "responses", _responses(max_output_tokens=-5)),
    ("max_output_tokens a float", "responses", _responses(max_output_tokens=1.5)),
    ("temperature NaN as a string", "responses", _responses(temperature="NaN")),
    ("temperature 1e999 as a string", "messages", _messages(temperature="1e999")),
    ("top_p inf as a string", "messages", _messages(top_p="inf")),
    ("a text block's text a number", "messages",
     _messages(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])),
    ("tool_use input a string", "messages",
     _messages(messages=_assistant({"type": "tool_use", "id": "t1", "name": "ls",
                                    "input": "str"}))),
    ("redacted_thinking data a number", "messages",
     _messages(messages=_assistant({"type": "redacted_thinking", "data": 5}))),
    ("a tool's input_schema a string", "messages",
     _messages(tools=[{"name": "ls", "input_schema": "x"}])),
    ("an image that is not base64", "count", _count(messages=_image("not base64 at all!!"))),
    ("an image that is not base64", "messages", _messages(messages=_image("not base64 at all!!"))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "api", "body"), REPRODUCED, ids=[f"{a}: {c}" for c, a, _ in REPRODUCED]
)
def test_reproduced_failures_are_400_in_the_apis_format(
    serve: Serve, case: str, api: str, body: Any
) -> None:
    """Each reproduced 500 or accepted garbage: one 400 in the API's format naming the field,
    nothing stored, nothing forwarded."""
    refused(serve, api, body)


def test_count_tokens_refuses_what_messages_refuses_and_counts_what_it_takes(
    serve: Serve,
) -> None:
    """A real PNG is counted and sent; the same block with bogus base64 is refused by both."""
    good = serve.send("count", _count(messages=_image(PNG)))
    assert good.status == 200 and good.json()["input_tokens"] > 0, good.text
    assert serve.send("messages", _messages(messages=_image(PNG))).status == 200


# --- today's anthropic SDK ---------------------------------------------------------------------


def anthropic_client(serve: Serve, cid: str | None = None) -> anthropic.Anthropic:
    headers = {"X-Recap-Conversation": cid} if cid else {}
    return anthropic.Anthropic(
        base_url=serve.base_url.removesuffix("/v1"),
        api_key=KEY,
        max_retries=0,
        timeout=60,
        default_headers=headers,
    )


def test_todays_anthropic_sdk_parameters_are_accepted_and_carried(either: Serve) -> None:
    """messages.create and count_tokens with the SDK's top-level cache_control, output_config
    (effort and a JSON schema format), service_tier, speed and diagnostics: answered and
    stored; effort and format reach the upstream as chat completions spells them."""
    serve = either
    cid = new_id()
    client = anthropic_client(serve, cid)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    before = len(serve.upstream.requests)
    reply = client.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=[user("structured please")],
        cache_control={"type": "ephemeral", "ttl": "5m"},
        output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}},
        service_tier="auto",
        speed="standard",
        diagnostics={"previous_message_id": None},
    )
    assert reply.content and serve.rows(cid) == 2
    sent = serve.upstream.requests[before]
    assert sent["reasoning_effort"] == "low"
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"] == schema
    assert "cache_control" not in sent and "output_config" not in sent
    counted = client.messages.count_tokens(
        model=MODEL,
        messages=[user("structured please")],
        cache_control={"type": "ephemeral"},
        output_config={"effort": "high"},
    )
    assert counted.input_tokens > 0


HEADER_PARAMS = {"user_profile_id", "workspace_id", "betas"}  # the SDK sends these as headers


def test_every_parameter_of_the_installed_sdk_is_known() -> None:
    """Each body parameter of the installed anthropic SDK's create and count_tokens (and their
    beta forms) is one recap serve checks: accepted, or refused by name with a reason, never
    'Extra inputs are not permitted'."""
    from anthropic.types import message_count_tokens_params, message_create_params
    from anthropic.types.beta import message_count_tokens_params as beta_count
    from anthropic.types.beta import message_create_params as beta_create

    from recap.workers.serve.validation import messages as rules

    create = {
        *message_create_params.MessageCreateParamsStreaming.__annotations__,
        *beta_create.MessageCreateParamsStreaming.__annotations__,
    }
    count = {
        *message_count_tokens_params.MessageCountTokensParams.__annotations__,
        *beta_count.MessageCountTokensParams.__annotations__,
    }
    assert create - HEADER_PARAMS <= rules.CREATE_FIELDS, create - rules.CREATE_FIELDS
    assert count - HEADER_PARAMS <= rules.COUNT_FIELDS, count - rules.COUNT_FIELDS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("container", "container_1"),
        ("mcp_servers", [{"type": "url", "url": "https://example.com/mcp", "name": "x"}]),
        ("inference_geo", "us"),
        ("billing_policy", {"type": "billing_policy", "bill_to": "self"}),
        ("compaction", {"type": "summarize"}),
        ("fallbacks", "default"),
        ("thread", {"id": "t"}),
    ],
)
def test_parameters_the_upstream_cannot_take_are_named(
    serve: Serve, field: str, value: Any
) -> None:
    """What chat completions cannot carry is a 400 naming the parameter, for both routes."""
    from recap.workers.serve.validation import messages as rules

    for api, body in (("messages", _messages()), ("count", _count())):
        if api == "count" and field not in rules.COUNT_FIELDS:
            continue  # not a count_tokens parameter: refused as an extra input
        if api == "count" and field == "compaction":
            assert serve.send(api, {**body, field: value}).status == 200  # ignored, as there
            continue
        message = refused(serve, api, {**body, field: value})
        assert field in message, message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cache_control", {"type": "persistent"}),
        ("cache_control", {"type": "ephemeral", "ttl": "1d"}),
        ("output_config", {"effort": "extreme"}),
        ("output_config", {"format": {"type": "json_schema", "schema": "x"}}),
        ("service_tier", "priority"),
        ("speed", 5),
        ("diagnostics", {"previous_message_id": 5}),
        ("context_management", "clear"),
    ],
)
def test_todays_parameters_are_checked(serve: Serve, field: str, value: Any) -> None:
    message = refused(serve, "messages", _messages(**{field: value}))
    assert field in message, message


# --- the fuzz ----------------------------------------------------------------------------------

# seeded cases per API: a fast subset by default, the full count under -m slow (bench.suite_slow);
# bench.serve_hostile runs 4,000
FUZZ_CASES = {"direct": (40, 150), "litellm": (15, 50)}


@pytest.mark.parametrize("size", [0, pytest.param(1, marks=pytest.mark.slow)], ids=["fast", "full"])
@pytest.mark.parametrize("api", ["responses", "messages", "count"])
def test_fuzzed_bodies_never_get_a_500(either: Serve, api: str, size: int) -> None:
    """Hypothesis over each body (well-formed, and spoiled at any depth): never a 500; every
    refusal is in the API's error format."""
    from hypothesis import HealthCheck, given, seed, settings

    from tests.support.hostile_api_bodies import messages_bodies, responses_bodies

    cases = FUZZ_CASES[either.path][size]
    strategy = responses_bodies(MODEL) if api == "responses" else messages_bodies(MODEL)
    statuses: Counter[int] = Counter()

    @seed(27)
    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(case: tuple[Any, str | None]) -> None:
        body, cid = case
        if api == "count" and isinstance(body, dict):
            body = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
        answer = either.send(api, body, cid)
        statuses[answer.status] += 1
        assert answer.status != 500, (body, answer.text)
        if answer.status >= 400:
            assert answer.error_message(api), (body, answer.text)

    one()
    assert statuses[200] > 0 and statuses[400] > 0, statuses


# --- the differential --------------------------------------------------------------------------


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [user()], **fields}


CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}


def differential_cases(value: Any) -> list[tuple[str, dict[str, Any]]]:
    """For one value, each API's body carrying it in the field that means the same thing."""
    chat_call = {**CALL, "function": {"name": "ls", "arguments": value}}
    return [
        # the sampling temperature
        ("chat", _chat(temperature=value)),
        ("responses", _responses(temperature=value)),
        ("messages", _messages(temperature=value)),
        # nucleus sampling
        ("chat", _chat(top_p=value)),
        ("responses", _responses(top_p=value)),
        ("messages", _messages(top_p=value)),
        # the reply's token cap
        ("chat", _chat(max_tokens=value)),
        ("responses", _responses(max_output_tokens=value)),
        ("messages", _messages(max_tokens=value)),
        # a message's content
        ("chat", _chat(messages=[{"role": "user", "content": value}])),
        ("responses", _responses(input=[{"role": "user", "content": value}])),
        ("messages", _messages(messages=[{"role": "user", "content": value}])),
        # a text part's text
        ("chat", _chat(messages=[{"role": "user", "content": [{"type": "text", "text": value}]}])),
        ("responses", _responses(input=[{"role": "user", "content": [
            {"type": "input_text", "text": value}]}])),
        ("messages", _messages(messages=[{"role": "user", "content": [
            {"type": "text", "text": value}]}])),
        # a tool's parameter schema
        ("chat", _chat(tools=[{"type": "function", "function": {"name": "ls",
                                                              "parameters": value}}])),
        ("responses", _responses(tools=[{"type": "function", "name": "ls", "parameters": value}])),
        ("messages", _messages(tools=[{"name": "ls", "input_schema": value}])),
        # a tool call's name
        ("chat", _chat(messages=[user(), {"role": "assistant", "content": None, "tool_calls": [
            {**CALL, "function": {"name": value, "arguments": "{}"}}]}, {
                "role": "tool", "tool_call_id": "call_1", "content": "x"}])),
        ("responses", _responses(input=[user(), {"type": "function_call", "call_id": "call_1",
                                                 "name": value, "arguments": "{}"}])),
        ("messages", _messages(messages=_assistant({"type": "tool_use", "id": "call_1",
                                                    "name": value, "input": {}}))),
        # a tool call's arguments (chat: the arguments string; Messages: the input object)
        ("chat", _chat(messages=[user(), {"role": "assistant", "content": None,
                                          "tool_calls": [chat_call]}])),
        ("responses", _responses(input=[user(), {"type": "function_call", "call_id": "call_1",
                                                 "name": "ls", "arguments": value}])),
        # a tool result's content
        ("chat", _chat(messages=[user(), {"role": "assistant", "content": None,
                                          "tool_calls": [CALL]},
                                 {"role": "tool", "tool_call_id": "call_1", "content": value}])),
        ("responses", _responses(input=[user(), {"type": "function_call", "call_id": "call_1",
                                                 "name": "ls", "arguments": "{}"},
                                        {"type": "function_call_output", "call_id": "call_1",
                                         "output": value}])),
        # the end user
        ("chat", _chat(user=value)),
        ("responses", _responses(user=value)),
        ("messages", _messages(metadata={"user_id": value})),
        # the request's metadata
        ("chat", _chat(metadata=value)),
        ("responses", _responses(metadata=value)),
        # the stream flag
        ("chat", _chat(stream=value)),
        ("responses", _responses(stream=value)),
        ("messages", _messages(stream=value)),
        # the model
        ("chat", {**_chat(), "model": value}),
        ("responses", {**_responses(), "model": value}),
        ("messages", {**_messages(), "model": value}),
    ]  # fmt: skip


# Bad wherever they go: wrong types, non-finite numbers and numbers spelled as strings.
BAD_VALUES: list[Any] = [
    "NaN", "inf", "-Infinity", "1e999", "0.5", "hot", True, [], [1], {"a": 1}, 5, -5, 1.5,
]  # fmt: skip


def _verdict(answer: Answered) -> str:
    return "ok" if answer.status == 200 else "refused" if 400 <= answer.status < 500 else "error"


@pytest.mark.parametrize("value", BAD_VALUES, ids=[json.dumps(v) for v in BAD_VALUES])
def test_each_api_refuses_what_chat_completions_refuses(serve: Serve, value: Any) -> None:
    """For each field, the same value gets the same verdict from every API (the differential):
    a refusal from one is a refusal from all, and count_tokens agrees with messages."""
    groups: list[list[tuple[str, str]]] = []
    for api, body in differential_cases(value):
        if api == "chat":
            groups.append([])
        answer = serve.send(api, body, new_id())
        assert answer.status != 500, (api, body, answer.text)
        groups[-1].append((api, _verdict(answer)))
        counted = {k: v for k, v in body.items() if k != "max_tokens"}
        varied = counted != _count()  # the value is in a field count_tokens has too
        if api == "messages" and varied and set(counted) <= {"model", "messages", "tools"}:
            groups[-1].append(("count", _verdict(serve.send("count", counted))))
    for group in groups:
        assert len({verdict for _, verdict in group}) == 1, (value, group)
