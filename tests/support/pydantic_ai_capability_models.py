"""The model stubs and message helper Pydantic AI's capability tests share, for those tests run
with Recap (``tests/test_pydantic_ai_peer_capabilities.py``).

Copied from pydantic/pydantic-ai at commit 4fda38988f2939fa6ea9cdefcf120693e10ef491: the model
stubs are ``tests/capability_models.py`` whole, ``iter_message_parts`` is from
``tests/conftest.py`` (without its typing overloads). Copyright (c) Pydantic Services Inc. 2024
to present, MIT licence (https://github.com/pydantic/pydantic-ai/blob/main/LICENSE).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls

# --- tests/capability_models.py ---


def make_text_response(text: str = "hello") -> ModelResponse:
    return ModelResponse(parts=[TextPart(content=text)])


def simple_model_function(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return make_text_response("response from model")


async def simple_stream_function(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str]:
    yield "streamed response"


async def tool_calling_stream_function(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """A streaming model that calls a tool on first request, then returns text."""
    for msg in messages:
        for part in msg.parts:
            if isinstance(part, ToolReturnPart):
                yield "final response"
                return

    if info.function_tools:
        tool = info.function_tools[0]
        yield {0: DeltaToolCall(name=tool.name, json_args="{}", tool_call_id="call-1")}
        return

    yield "no tools available"  # pragma: no cover


def tool_calling_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that calls a tool on first request, then returns text."""
    # Check if there's already a tool return in messages (i.e., tool was called)
    for msg in messages:
        for part in msg.parts:
            if isinstance(part, ToolReturnPart):
                return make_text_response("final response")

    # First request: call the tool
    if info.function_tools:
        tool = info.function_tools[0]
        return ModelResponse(
            parts=[ToolCallPart(tool_name=tool.name, args="{}", tool_call_id="call-1")]
        )

    return make_text_response("no tools available")  # pragma: no cover


# --- from tests/conftest.py ---


def iter_message_parts(
    messages: Sequence[ModelMessage],
    message_type: type[ModelRequest] | type[ModelResponse],
    part_type: type[Any],
) -> Iterator[Any]:
    """Iterate over all parts of a given type in messages of a given type."""
    for msg in messages:  # pragma: no branch
        if isinstance(msg, message_type):
            for part in msg.parts:
                if isinstance(part, part_type):
                    yield part
