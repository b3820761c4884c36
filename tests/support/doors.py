"""The live loop through every door: the same seeded sessions (``tests.support.framework_loop``:
a provider counting by content, a real ``recap worker`` between turns) through the Python API,
`recap serve`'s chat completions, Responses and Messages APIs, and the LangChain, Agents SDK and
Pydantic AI adapters. Each door is a ``MakeTalk``: given the host, the stand-in model server,
the conversation id, the window and the session's tool outputs, a coroutine per user turn.

The serve doors talk to a `recap serve` process per window (its window is a setting), on the
stack's database and broker, whose upstream is one stand-in server given each session's
provider in turn. ``run_door`` runs a list of draws through one door and adds the figures up;
``tests/test_doors.py`` runs a fast subset, ``python -m bench doors`` the full table.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recap.core.client import Recap
from recap.integrations import _loop
from recap.workers.enqueue import compress_later
from tests.support import framework_loop as loop
from tests.support.frameworks_stack import FrameworkStack
from tests.support.llm_server import LLMServer
from tests.support.serve_stack import serve_env, serve_process

LOOKUP_DOC = (
    "Look up an order, a shipment or a payment record by its key. Returns the JSON record as "
    "the shop's back office stores it: the order id, the tracking number, the status and the "
    "agent's notes. Use it before answering any question about an order."
)
LOOKUP_SCHEMA = {
    "type": "object",
    "properties": {"key": {"type": "string"}},
    "required": ["key"],
}
CLIENT_KEY = "door-key-aaaa-1111"
SERVE_MODEL = "openai/stand-in"
MESSAGES_MAX_TOKENS = 256
DOORS = (
    "python_api",
    "serve_chat",
    "serve_responses",
    "serve_messages",
    "langchain",
    "agents_sdk",
    "pydantic_ai",
)
SERVE_DOORS = ("serve_chat", "serve_responses", "serve_messages")
# the doors whose client can edit an earlier message and send it again: the Python API
# (``parent_id``) and serve's chat completions and Messages (the whole history is resent);
# serve's Responses input is resent whole too, but its clients chain by ``previous_response_id``
# rather than edit, and the frameworks keep their own history (an edit is not theirs to make)
EDIT_DOORS = ("python_api", "serve_chat", "serve_messages")
# the doors that carry images: all seven (each in its own format, converted from the session's
# OpenAI parts by ``_parts_for``)
IMAGE_DOORS = DOORS


def _split(message: loop.Content) -> tuple[str, list[str]]:
    """A session's user message as its text and its images' data URLs."""
    if isinstance(message, str):
        return message, []
    text = "".join(str(p.get("text") or "") for p in message if p.get("type") == "text")
    urls = [p["image_url"]["url"] for p in message if p.get("type") == "image_url"]
    return text, urls


def _responses_content(message: loop.Content) -> Any:
    text, urls = _split(message)
    if not urls:
        return text
    return [{"type": "input_text", "text": text}] + [
        {"type": "input_image", "image_url": url, "detail": "auto"} for url in urls
    ]


def _messages_content(message: loop.Content) -> Any:
    text, urls = _split(message)
    if not urls:
        return text
    images = [
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": url.split(",", 1)[1]},
        }
        for url in urls
    ]
    return [{"type": "text", "text": text}, *images]


def _key(arguments: Any) -> str:
    loaded = json.loads(arguments) if isinstance(arguments, str) else arguments
    return str(loaded["key"])


# --- the Python API and the adapters -------------------------------------------------------------


def python_api_talk(
    recap: Recap, server: LLMServer, cid: str, window: int, outputs: dict[str, str]
) -> loop.Talk:
    """The README's host loop on the Python API (assemble, call, record the usage, add the
    reply; compress on ``BudgetError`` or on the provider's context-length error and send the
    new request once)."""
    from openai import AsyncOpenAI, BadRequestError

    from recap.core.errors import BudgetError

    client = AsyncOpenAI(base_url=server.url, api_key="test-key", max_retries=0)
    tools = [_loop.openai_tool(loop.TOOL_NAME, LOOKUP_DOC, LOOKUP_SCHEMA)]
    recap.new(cid, max_input_tokens=window)
    ids: dict[str, int | None] = {"head": None, "before_user": None}

    def assemble() -> Any:
        try:
            return recap.assemble(cid, system=loop.SYSTEM, tools=tools)
        except BudgetError:
            recap.compress(cid)
            return recap.assemble(cid, system=loop.SYSTEM, tools=tools)

    async def call(messages: list[dict[str, Any]]) -> Any:
        return await client.chat.completions.create(
            model="stand-in",
            messages=messages,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
        )

    async def step() -> bool:
        built = assemble()
        try:
            reply = await call(built.messages)
        except BadRequestError as exc:
            if not _loop.is_context_overflow(exc):
                raise
            recap.compress(cid, force=True)
            again = assemble()
            if again.messages == built.messages:
                raise
            reply = await call(again.messages)
        usage = reply.usage
        details = usage.prompt_tokens_details
        recap.record_usage(
            cid,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=(details.cached_tokens or 0) if details else 0,
        )
        message = reply.choices[0].message.model_dump(exclude_none=True)
        ids["head"] = recap.add(cid, message)
        for tool_call in message.get("tool_calls") or ():
            content = outputs[_key(tool_call["function"]["arguments"])]
            result = {"role": "tool", "tool_call_id": tool_call["id"], "content": content}
            ids["head"] = recap.add(cid, result)
        return bool(message.get("tool_calls"))

    async def talk(message: loop.Content, edit: bool = False) -> None:
        # an edit: the new message is a sibling of the previous user message (a branch from
        # the message before it), the branch head from then on
        parent = ids["before_user"] if edit else ids["head"]
        added = recap.add(cid, {"role": "user", "content": message}, parent_id=parent)
        ids["before_user"], ids["head"] = parent, added
        while await step():
            pass
        compress_later(cid, broker_url=recap.settings.broker_url)

    return talk


def langchain_talk(
    recap: Recap, server: LLMServer, cid: str, window: int, outputs: dict[str, str]
) -> loop.Talk:
    """A ``create_agent`` agent with ``RecapMiddleware`` on a checkpointed thread."""
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    from recap.integrations.langchain import RecapMiddleware

    def lookup(key: str) -> str:
        return outputs[key]

    tool = StructuredTool.from_function(lookup, name=loop.TOOL_NAME, description=LOOKUP_DOC)
    model = ChatOpenAI(model="stand-in", base_url=server.url, api_key="test-key", max_retries=0)
    middleware = RecapMiddleware(recap=recap, max_input_tokens=window)
    agent = create_agent(
        model,
        [tool],
        system_prompt=loop.SYSTEM,
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": cid}}
    graph: Any = agent

    async def talk(message: loop.Content) -> None:
        await graph.ainvoke({"messages": [{"role": "user", "content": message}]}, config)

    return talk


def pydantic_ai_talk(
    recap: Recap, server: LLMServer, cid: str, window: int, outputs: dict[str, str]
) -> loop.Talk:
    """An ``Agent`` with ``RecapHistory`` as a capability."""
    from pydantic_ai import Agent, Tool
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from recap.integrations.pydantic_ai import RecapHistory

    def lookup(key: str) -> str:
        return outputs[key]

    provider = OpenAIProvider(base_url=server.url, api_key="test-key")
    history = RecapHistory(cid, recap=recap, max_input_tokens=window)
    tool = Tool(lookup, name=loop.TOOL_NAME, description=LOOKUP_DOC)
    agent = Agent(
        OpenAIChatModel("stand-in", provider=provider),
        system_prompt=loop.SYSTEM,
        tools=[tool],
        capabilities=[history],
    )

    async def talk(message: loop.Content) -> None:
        from pydantic_ai import ImageUrl

        text, urls = _split(message)
        await agent.run([text, *(ImageUrl(url=url) for url in urls)] if urls else text)

    return talk


def agents_sdk_talk(
    recap: Recap, server: LLMServer, cid: str, window: int, outputs: dict[str, str]
) -> loop.Talk:
    """An Agents SDK ``Agent`` on a chat-completions model wrapped by ``RecapSession``."""
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    from recap.integrations.openai_agents import RecapSession

    set_tracing_disabled(True)

    def lookup(key: str) -> str:
        return outputs[key]

    tool = function_tool(lookup, name_override=loop.TOOL_NAME, description_override=LOOKUP_DOC)
    session: Any = RecapSession(cid, recap=recap, max_input_tokens=window)
    client = AsyncOpenAI(base_url=server.url, api_key="test-key", max_retries=0)
    model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
    agent = Agent(name="support", instructions=loop.SYSTEM, model=session.wrap(model), tools=[tool])

    async def talk(message: loop.Content) -> None:
        content = _responses_content(message)
        given: Any = content if isinstance(content, str) else [{"role": "user", "content": content}]
        await Runner.run(agent, given, session=session)

    return talk


# --- recap serve ---------------------------------------------------------------------------------


async def _chat_reply(client: Any, stream: bool, **request: Any) -> tuple[Any, list[Any]]:
    """A chat completions call, streamed or not: the reply's text and its tool calls (streamed:
    put together from the chunks, the usage chunk asked for)."""
    if not stream:
        message = (await client.chat.completions.create(**request)).choices[0].message
        return message.content, list(message.tool_calls or [])
    chunks = await client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            text.append(delta.content or "")
            for part in delta.tool_calls or ():
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = part.id or call["id"]
                if part.function is not None:
                    call["name"] += part.function.name or ""
                    call["arguments"] += part.function.arguments or ""
    from openai.types.chat import ChatCompletionMessageFunctionToolCall as ToolCall

    made = [
        ToolCall.model_validate(
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
        )
        for _, c in sorted(calls.items())
    ]
    return "".join(text) or None, made


def serve_chat_talk(base_url: str, stream: bool = False) -> loop.MakeTalk:
    """A client of serve's chat completions: the whole history sent every call (streamed with
    ``stream``), tool results added by the client; an edit drops the previous user message and
    what followed it from the history and sends the new one in its place."""

    def make(
        recap: Recap, server: LLMServer, cid: str, window: int, outputs: dict[str, str]
    ) -> loop.Talk:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=CLIENT_KEY, max_retries=0, timeout=120)
        tools = [_loop.openai_tool(loop.TOOL_NAME, LOOKUP_DOC, LOOKUP_SCHEMA)]
        messages: list[dict[str, Any]] = [{"role": "system", "content": loop.SYSTEM}]
        last_user = [len(messages)]

        async def talk(text: loop.Content, edit: bool = False) -> None:
            if edit:
                del messages[last_user[0] :]
            last_user[0] = len(messages)
            messages.append({"role": "user", "content": text})
            while True:
                content, calls = await _chat_reply(
                    client,
                    stream,
                    model=SERVE_MODEL,
                    messages=messages,
                    tools=tools,
                    extra_headers={"X-Recap-Conversation": cid},
                )
                sent: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    sent["tool_calls"] = [call.model_dump(exclude_none=True) for call in calls]
                messages.append(sent)
                if not calls:
                    return
                for call in calls:
                    output = outputs[_key(call.function.arguments)]
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})

        return talk

    return make


def serve_responses_talk(base_url: str, stream: bool = False) -> loop.MakeTalk:
    """A client of serve's Responses API: the whole input sent every call (messages, function
    calls and their outputs), the system prompt as ``instructions``; with ``stream``, streamed
    and the response taken from its ``response.completed`` event."""

    def make(
        recap: Recap, server: LLMServer, cid: str, window: int, outputs: dict[str, str]
    ) -> loop.Talk:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=CLIENT_KEY, max_retries=0, timeout=120)
        tool = {
            "type": "function",
            "name": loop.TOOL_NAME,
            "description": LOOKUP_DOC,
            "parameters": LOOKUP_SCHEMA,
        }
        items: list[dict[str, Any]] = []

        async def respond() -> Any:
            request: Any = {
                "model": SERVE_MODEL,
                "instructions": loop.SYSTEM,
                "input": items,
                "tools": [tool],
                "extra_headers": {"X-Recap-Conversation": cid},
            }
            if not stream:
                return await client.responses.create(**request)
            done = None
            async for event in await client.responses.create(**request, stream=True):
                if event.type == "response.completed":
                    done = event.response
            assert done is not None, "the stream ended without response.completed"
            return done

        async def talk(text: loop.Content) -> None:
            items.append({"role": "user", "content": _responses_content(text)})
            while True:
                response = await respond()
                calls = []
                for item in response.output:
                    if item.type == "function_call":
                        calls.append(item)
                        items.append(
                            {
                                "type": "function_call",
                                "call_id": item.call_id,
                                "name": item.name,
                                "arguments": item.arguments,
                            }
                        )
                    elif item.type == "message":
                        said = "".join(getattr(part, "text", "") for part in item.content)
                        items.append({"role": "assistant", "content": said})
                if not calls:
                    return
                for call in calls:
                    items.append(
                        {
                            "type": "function_call_output",
                            "call_id": call.call_id,
                            "output": outputs[_key(call.arguments)],
                        }
                    )

        return talk

    return make


def serve_messages_talk(base_url: str, stream: bool = False) -> loop.MakeTalk:
    """A client of serve's Messages API (the anthropic SDK): the whole history sent every call
    (streamed with ``stream``: the SDK's ``messages.stream`` and its final message), tool
    results as ``tool_result`` blocks of the next user message; an edit drops the previous user
    message and what followed it and sends the new one in its place."""

    def make(
        recap: Recap, server: LLMServer, cid: str, window: int, outputs: dict[str, str]
    ) -> loop.Talk:
        from anthropic import AsyncAnthropic

        client = AsyncAnthropic(
            base_url=base_url.removesuffix("/v1"),
            api_key=CLIENT_KEY,
            max_retries=0,
            timeout=120,
            default_headers={"X-Recap-Conversation": cid},
        )
        tool = {"name": loop.TOOL_NAME, "description": LOOKUP_DOC, "input_schema": LOOKUP_SCHEMA}
        messages: list[dict[str, Any]] = []
        last_user = [0]

        async def reply_to() -> Any:
            request: Any = {
                "model": SERVE_MODEL,
                "max_tokens": MESSAGES_MAX_TOKENS,
                "system": loop.SYSTEM,
                "messages": messages,
                "tools": [tool],
            }
            if not stream:
                return await client.messages.create(**request)
            async with client.messages.stream(**request) as streamed:
                return await streamed.get_final_message()

        async def talk(text: loop.Content, edit: bool = False) -> None:
            if edit:
                del messages[last_user[0] :]
            last_user[0] = len(messages)
            messages.append({"role": "user", "content": _messages_content(text)})
            while True:
                reply = await reply_to()
                blocks = [block.model_dump(exclude_none=True) for block in reply.content]
                messages.append({"role": "assistant", "content": blocks})
                uses = [block for block in reply.content if block.type == "tool_use"]
                if not uses:
                    return
                results = [
                    {
                        "type": "tool_result",
                        "tool_use_id": use.id,
                        "content": outputs[_key(use.input)],
                    }
                    for use in uses
                ]
                messages.append({"role": "user", "content": results})

        return talk

    return make


SERVE_TALKS: dict[str, Callable[[str, bool], loop.MakeTalk]] = {
    "serve_chat": serve_chat_talk,
    "serve_responses": serve_responses_talk,
    "serve_messages": serve_messages_talk,
}
TALKS: dict[str, loop.MakeTalk] = {
    "python_api": python_api_talk,
    "langchain": langchain_talk,
    "agents_sdk": agents_sdk_talk,
    "pydantic_ai": pydantic_ai_talk,
}


@dataclass
class Serves:
    """`recap serve` processes on the stack, one per window, sharing one upstream server."""

    stack: FrameworkStack
    folder: Path
    upstream: LLMServer
    urls: dict[int, str] = field(default_factory=dict)
    _exits: ExitStack = field(default_factory=ExitStack)

    def url(self, window: int) -> str:
        if window not in self.urls:
            env = serve_env(
                self.stack.database_url,
                self.folder / f"serve-{window}",
                keys=CLIENT_KEY,
                upstream=self.upstream.url,
                upstream_key="sk-upstream-0123456789abcdef",
                window=window,
                **{k: v for k, v in self.stack.host_env().items() if k != "RECAP_DATABASE_URL"},
            )
            process = self._exits.enter_context(serve_process(env, self.folder / f"s{window}"))
            self.urls[window] = process.base_url
        return self.urls[window]

    def close(self) -> None:
        self._exits.close()


@contextmanager
def serves(stack: FrameworkStack, folder: Path) -> Iterator[Serves]:
    upstream = LLMServer(default=loop.model_reply(0)).start()
    running = Serves(stack, folder, upstream)
    try:
        yield running
    finally:
        running.close()
        upstream.stop()


def run_door(
    stack: FrameworkStack,
    recap: Recap,
    door: str,
    draws: list[loop.Draw],
    running: Serves | None = None,
) -> loop.Figures:
    """The draws through one door, one session after another; the figures added up."""
    total = loop.Figures()
    for given in draws:
        # what the door cannot take is left out of its session (``EDIT_DOORS``, ``IMAGE_DOORS``;
        # streaming is asked of the serve doors only)
        draw = replace(
            given,
            edits=given.edits and door in EDIT_DOORS,
            images=given.images and door in IMAGE_DOORS,
            outputs={},
        )
        if door in SERVE_TALKS:
            assert running is not None, "the serve doors need their serve processes"
            make = SERVE_TALKS[door](running.url(draw.window), draw.stream)
            session = loop.run_session(stack, recap, make, draw, door, running.upstream)
        else:
            session = loop.run_session(stack, recap, TALKS[door], draw, door)
        total.add(asyncio.run(session))
    return total
