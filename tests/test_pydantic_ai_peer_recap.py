"""Pydantic AI's own history-processor tests with ``RecapHistory`` in the processor's place.

Adapted from pydantic/pydantic-ai, ``tests/test_history_processor.py`` at commit
4fda38988f2939fa6ea9cdefcf120693e10ef491 (22 August 2026, after the v2.33.0 tag: the newest
snapshot of the repository available; it has no tag of the installed 2.78 release, and that
release's sources are not published with it). Copyright (c) Pydantic Services Inc. 2024 to
present, MIT licence (https://github.com/pydantic/pydantic-ai/blob/main/LICENSE).

Changed only where the agent is made: each case whose processor keeps the history as it is
(``no_op``, ``deepcopy``, ``rebuild``, the ``HistoryProcessor`` type) has it replaced by
``RecapHistory``, and each case with no processor (``resuming_without_prompt...``) or with
``ReinjectSystemPrompt`` gets ``RecapHistory`` added, on a fresh Recap conversation with a
window the case fits in; every case runs twice, ``RecapHistory`` as a capability and as
``ProcessHistory(RecapHistory)`` (the ``recap`` fixture). The assertions are upstream's: what the
provider receives, ``all_messages()`` and ``new_messages()`` equal theirs, so Recap's assembly of
a conversation that fits is the run's own history, message for message.

Left out, each because its processor reshapes the history its own way (what ``RecapHistory``,
which sends Recap's assembly, is not meant to do) or because it tests how Pydantic AI calls a
processor rather than what a processor gives back:
- ``run_replaces_message_history``, ``streaming_replaces_message_history``,
  ``messages_sent_to_provider``, ``multiple_history_processors``, ``async_history_processor``,
  ``sync_history_processor_returning_coroutine``,
  ``sync_history_processor_with_context_returning_coroutine``, ``on_streamed_run``,
  ``with_context``, ``with_context_async``, ``mixed_signatures``, ``replace_messages``,
  ``reorder_old_new``, ``injects_into_new_stream``, ``injects_without_run_id_before_current_run``,
  ``overrides_run_id_uses_response_as_new_messages``, ``resuming_without_prompt`` (prepends a
  summary), ``replace_resumed_request...``, ``mutates_resumed_request...``,
  ``truncation_during_resumed_tool_loop...``, ``removes_message_after_resumed_request...``,
  ``insert_and_replace_resumed_request...``, ``new_messages_index_during_iter_with_pruning``
  (both): processors that drop, add, reorder or rewrite messages
- ``empty_history``, ``history_ending_in_response``: a processor returning an invalid history
- ``callable_class_history_processor_no_op`` and ``..._with_ctx_no_op``: ``no_op`` again once
  the processor is ``RecapHistory`` (itself a callable class taking the run context)
- ``without_annotations``, ``unresolvable_annotations``: how a processor's signature is read
"""

# ruff: noqa
# mypy: ignore-errors
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

from pydantic_ai import (
    Agent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
    capture_run_messages,
)
from pydantic_ai.capabilities import HistoryProcessor, ProcessHistory, ReinjectSystemPrompt
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext
from pydantic_ai.usage import RequestUsage

from recap.core.client import Recap
from recap.core.settings import Settings
from recap.integrations.pydantic_ai import RecapHistory
from tests.support.pydantic_ai_matchers import IsDatetime, IsStr, snapshot
from tests.support.hosts import fresh_recap

pytestmark = [pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Peer:
    """The ``RecapHistory`` of a case, and what the agent is given: itself as a capability,
    or wrapped in ``ProcessHistory`` as a history processor."""

    history: RecapHistory
    capability: Any


@pytest.fixture(params=["capability", "processor"])
def recap(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Peer]:
    with fresh_recap(tmp_path) as host:
        history = RecapHistory("peer-case", recap=host, max_input_tokens=32_000, enqueue=False)
        yield Peer(history, history if request.param == "capability" else ProcessHistory(history))


@pytest.fixture
def received_messages() -> list[ModelMessage]:
    return []


@pytest.fixture
def function_model(received_messages: list[ModelMessage]) -> FunctionModel:
    def capture_model_function(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # Capture the messages that the provider actually receives
        received_messages.clear()
        received_messages.extend(messages)
        return ModelResponse(parts=[TextPart(content="Provider response")])

    async def capture_model_stream_function(
        messages: list[ModelMessage], _info: AgentInfo
    ) -> AsyncIterator[str]:
        received_messages.clear()
        received_messages.extend(messages)
        yield "hello"

    return FunctionModel(capture_model_function, stream_function=capture_model_stream_function)


async def test_history_processor_public_type(function_model: FunctionModel, recap: Peer) -> None:
    """`HistoryProcessor` is publicly importable so consumers can type their own processors."""

    # The public type annotates a processor that is then handed to `ProcessHistory`.
    processor: HistoryProcessor[None] = recap.history
    agent = Agent(function_model, system_prompt="SYSTEM", capabilities=[ProcessHistory(processor)])

    result = await agent.run("Hello")
    assert result.output == "Provider response"


async def test_history_processor_no_op(
    function_model: FunctionModel, received_messages: list[ModelMessage], recap: Peer
):
    agent = Agent(function_model, capabilities=[recap.capability])

    message_history = [
        ModelRequest(parts=[UserPromptPart(content="Previous question")]),
        ModelResponse(parts=[TextPart(content="Previous answer")]),
    ]

    with capture_run_messages() as captured_messages:
        result = await agent.run("New question", message_history=message_history)

    assert received_messages == snapshot(
        [
            ModelRequest(
                parts=[UserPromptPart(content="Previous question", timestamp=IsDatetime())]
            ),
            ModelResponse(parts=[TextPart(content="Previous answer")], timestamp=IsDatetime()),
            ModelRequest(
                parts=[UserPromptPart(content="New question", timestamp=IsDatetime())],
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
        ]
    )
    assert captured_messages == result.all_messages()
    assert result.all_messages() == snapshot(
        [
            ModelRequest(
                parts=[UserPromptPart(content="Previous question", timestamp=IsDatetime())]
            ),
            ModelResponse(parts=[TextPart(content="Previous answer")], timestamp=IsDatetime()),
            ModelRequest(
                parts=[UserPromptPart(content="New question", timestamp=IsDatetime())],
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
            ModelResponse(
                parts=[TextPart(content="Provider response")],
                usage=RequestUsage(input_tokens=54, output_tokens=4),
                model_name="function:capture_model_function:capture_model_stream_function",
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
        ]
    )
    assert result.new_messages() == result.all_messages()[-2:]


async def test_history_processor_deepcopy_resuming_without_prompt(
    function_model: FunctionModel, received_messages: list[ModelMessage], recap: Peer
):
    """
    When a history processor deep-copies messages (breaking object identity),
    new_messages() should still exclude the resumed request supplied via
    message_history.
    """

    agent = Agent(function_model, capabilities=[recap.capability])

    message_history = [
        ModelRequest(parts=[UserPromptPart(content="Original prompt")]),
    ]

    with capture_run_messages() as captured_messages:
        result = await agent.run(message_history=message_history)

    assert captured_messages == result.all_messages()
    assert result.all_messages() == snapshot(
        [
            ModelRequest(
                parts=[
                    UserPromptPart(
                        content="Original prompt",
                        timestamp=IsDatetime(),
                    )
                ],
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
            ModelResponse(
                parts=[TextPart(content="Provider response")],
                usage=RequestUsage(input_tokens=52, output_tokens=2),
                model_name="function:capture_model_function:capture_model_stream_function",
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
        ]
    )

    assert result.new_messages() == result.all_messages()[-1:]


async def test_history_processor_rebuild_resuming_without_prompt(
    function_model: FunctionModel, received_messages: list[ModelMessage], recap: Peer
):
    """
    When a history processor rebuilds `ModelRequest` instances with equivalent
    values, new_messages() should still exclude the resumed request supplied
    via message_history.
    """

    agent = Agent(function_model, capabilities=[recap.capability])

    message_history = [
        ModelRequest(parts=[UserPromptPart(content="Old question")]),
        ModelResponse(parts=[TextPart(content="Old answer")]),
        ModelRequest(parts=[UserPromptPart(content="Original prompt")]),
    ]

    with capture_run_messages() as captured_messages:
        result = await agent.run(message_history=message_history)

    assert captured_messages == result.all_messages()
    assert result.all_messages() == snapshot(
        [
            ModelRequest(
                parts=[
                    UserPromptPart(
                        content="Old question",
                        timestamp=IsDatetime(),
                    )
                ],
            ),
            ModelResponse(
                parts=[TextPart(content="Old answer")],
                timestamp=IsDatetime(),
            ),
            ModelRequest(
                parts=[
                    UserPromptPart(
                        content="Original prompt",
                        timestamp=IsDatetime(),
                    )
                ],
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
            ModelResponse(
                parts=[TextPart(content="Provider response")],
                usage=RequestUsage(input_tokens=54, output_tokens=4),
                model_name="function:capture_model_function:capture_model_stream_function",
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
        ]
    )

    assert result.new_messages() == result.all_messages()[-1:]


async def test_resuming_without_prompt_with_tool_calls_excludes_resumed_request(recap: Peer):
    """
    When resuming without a user prompt and the model enters a tool-call loop,
    new_messages() should exclude the resumed history request even though it
    gets the current run_id.
    """

    call_count = 0

    def model_function(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        nonlocal call_count
        call_count += 1
        if call_count == 1:
            return ModelResponse(
                parts=[ToolCallPart(tool_name="my_tool", args={}, tool_call_id="tool_call_1")],
            )
        return ModelResponse(parts=[TextPart(content="done")])

    agent = Agent(
        model=FunctionModel(model_function, model_name="test"), capabilities=[recap.capability]
    )

    @agent.tool
    async def my_tool(_ctx: RunContext) -> str:
        return "tool executed"

    with capture_run_messages() as captured_messages:
        result = await agent.run(
            message_history=[ModelRequest(parts=[UserPromptPart(content="Original prompt")])]
        )

    assert captured_messages == result.all_messages()
    assert result.all_messages() == snapshot(
        [
            ModelRequest(
                parts=[UserPromptPart(content="Original prompt", timestamp=IsDatetime())],
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
            ModelResponse(
                parts=[ToolCallPart(tool_name="my_tool", args={}, tool_call_id="tool_call_1")],
                usage=RequestUsage(input_tokens=52, output_tokens=2),
                model_name="test",
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
            ModelRequest(
                parts=[
                    ToolReturnPart(
                        tool_name="my_tool",
                        content="tool executed",
                        tool_call_id="tool_call_1",
                        timestamp=IsDatetime(),
                    )
                ],
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
            ModelResponse(
                parts=[TextPart(content="done")],
                usage=RequestUsage(input_tokens=54, output_tokens=3),
                model_name="test",
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
        ]
    )

    assert result.new_messages() == result.all_messages()[1:]


async def test_resuming_without_prompt_excludes_request_with_different_run_id(
    function_model: FunctionModel, received_messages: list[ModelMessage], recap: Peer
):
    """
    When running without a user prompt and the resumed request already has a
    run_id from a *previous* run, new_messages() should exclude it — only
    messages stamped with the current run_id should be returned.
    """
    previous_run_id = str(uuid.uuid4())

    agent = Agent(function_model, capabilities=[recap.capability])

    message_history = [
        ModelRequest(parts=[UserPromptPart(content="Earlier question")]),
        ModelResponse(parts=[TextPart(content="Earlier answer")]),
        ModelRequest(
            parts=[UserPromptPart(content="Previous run prompt")],
            run_id=previous_run_id,
        ),
    ]

    with capture_run_messages() as captured_messages:
        result = await agent.run(message_history=message_history)

    assert received_messages == snapshot(
        [
            ModelRequest(
                parts=[UserPromptPart(content="Earlier question", timestamp=IsDatetime())]
            ),
            ModelResponse(parts=[TextPart(content="Earlier answer")], timestamp=IsDatetime()),
            ModelRequest(
                parts=[UserPromptPart(content="Previous run prompt", timestamp=IsDatetime())],
                timestamp=IsDatetime(),
                run_id=previous_run_id,
                conversation_id=IsStr(),
            ),
        ]
    )

    assert captured_messages == result.all_messages()
    assert result.all_messages() == snapshot(
        [
            ModelRequest(
                parts=[UserPromptPart(content="Earlier question", timestamp=IsDatetime())]
            ),
            ModelResponse(parts=[TextPart(content="Earlier answer")], timestamp=IsDatetime()),
            ModelRequest(
                parts=[UserPromptPart(content="Previous run prompt", timestamp=IsDatetime())],
                timestamp=IsDatetime(),
                run_id=previous_run_id,
                conversation_id=IsStr(),
            ),
            ModelResponse(
                parts=[TextPart(content="Provider response")],
                usage=RequestUsage(input_tokens=55, output_tokens=4),
                model_name="function:capture_model_function:capture_model_stream_function",
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            ),
        ]
    )

    # The resumed request has a run_id from a different run: excluded from new_messages().
    assert result.new_messages() == result.all_messages()[-1:]
    assert result.new_messages()[0].run_id != previous_run_id


def _user_request_present(messages: list[ModelMessage]) -> bool:
    return any(
        isinstance(m, ModelRequest) and any(isinstance(p, UserPromptPart) for p in m.parts)
        for m in messages
    )


async def test_reinject_system_prompt_resuming_without_prompt_excludes_resumed_request(
    function_model: FunctionModel, received_messages: list[ModelMessage], recap: Peer
):
    """
    System-prompt reinjection (the UI adapters' default with `manage_system_prompt='server'`)
    rebuilds the first request via `replace(...)`, prepending a `SystemPromptPart`. When
    resuming without a new user prompt on the first turn, that first request *is* the resumed
    request, so the rewrite changes both its identity and its `parts`. It must still be treated
    as prior context and excluded from new_messages(). Regression test for the turn-1 leak in
    https://github.com/pydantic/pydantic-ai/issues/6025.
    """

    agent = Agent(
        function_model,
        system_prompt="Server prompt",
        capabilities=[ReinjectSystemPrompt(replace_existing=True), recap.capability],
    )

    message_history = [
        ModelRequest(parts=[UserPromptPart(content="Original prompt")]),
    ]

    with capture_run_messages() as captured_messages:
        result = await agent.run(message_history=message_history)

    # The model received the resumed request with the server prompt reinjected into it.
    assert received_messages == snapshot(
        [
            ModelRequest(
                parts=[
                    SystemPromptPart(content="Server prompt", timestamp=IsDatetime()),
                    UserPromptPart(content="Original prompt", timestamp=IsDatetime()),
                ],
                timestamp=IsDatetime(),
                run_id=IsStr(),
                conversation_id=IsStr(),
            )
        ]
    )
    assert captured_messages == result.all_messages()
    # The reinjected resumed request is excluded; only the model response is new.
    assert result.new_messages() == result.all_messages()[-1:]


async def test_reinject_system_prompt_resumed_tool_loop_excludes_resumed_request(recap: Peer):
    """
    System-prompt reinjection rebuilds the resumed request in place on *every* step of a
    multi-step resumed run (a tool-call loop). The resumed request must stay excluded from
    new_messages() across all steps, while every message produced this run is included.
    The pinned boundary is translated per step so the in-place rebuild never leaks it.
    """

    call_count = 0

    def model_function(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        nonlocal call_count
        call_count += 1
        if call_count == 1:
            return ModelResponse(
                parts=[ToolCallPart(tool_name="my_tool", args={}, tool_call_id="tool_call_1")]
            )
        return ModelResponse(parts=[TextPart(content="done")])

    agent = Agent(
        model=FunctionModel(model_function, model_name="test"),
        system_prompt="Server prompt",
        capabilities=[ReinjectSystemPrompt(replace_existing=True), recap.capability],
    )

    @agent.tool
    async def my_tool(_ctx: RunContext) -> str:
        return "tool executed"

    with capture_run_messages() as captured_messages:
        result = await agent.run(
            message_history=[ModelRequest(parts=[UserPromptPart(content="Original prompt")])]
        )

    assert captured_messages == result.all_messages()
    # The reinjected resumed request stays excluded; everything produced this run is new.
    assert result.new_messages() == result.all_messages()[1:]
    assert not _user_request_present(result.new_messages())
