"""``RecapHistory`` through the cases of Pydantic AI's own history-processor tests
(``tests/test_pydantic_ai_history_processor.py``) that apply to a processor holding the history
itself: Pydantic AI's ``FunctionModel`` captures what the provider receives, the agent runs as
a capability and as ``ProcessHistory``, streamed and not, with a tool call; then the loop's own
cases: the usage of every model call recorded, a context-length error compressed and retried
once with a different request, never the same one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

import pydantic_ai.messages
from pydantic_ai import Agent, ModelMessage, ModelResponse, ModelRetry, TextPart, ToolCallPart
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.exceptions import ModelContextWindowExceededError, ModelHTTPError
from pydantic_ai.messages import SystemPromptPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import text

from recap.core.client import Recap
from recap.integrations.pydantic_ai import RecapHistory
from tests.support.hosts import fresh_recap

pytestmark = [pytest.mark.anyio]
CID = "ticket-1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def recap(tmp_path: Path) -> Iterator[Recap]:
    with fresh_recap(tmp_path) as host:
        yield host


@pytest.fixture
def received() -> list[list[ModelMessage]]:
    return []


@pytest.fixture
def function_model(received: list[list[ModelMessage]]) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        received.append(list(messages))
        return ModelResponse(parts=[TextPart(content=f"Provider response {len(received)}")])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        received.append(list(messages))
        yield "hello"

    return FunctionModel(answer, stream_function=stream)


def texts(messages: list[ModelMessage]) -> list[str]:
    """Every text the provider received, in order (prompts, answers, tool returns)."""
    out: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart | SystemPromptPart | TextPart):
                out.append(str(part.content))
            elif isinstance(part, ToolReturnPart):
                out.append(f"return:{part.content}")
    return out


def usage_rows(recap: Recap) -> list[tuple[int, int]]:
    with recap.engine.connect() as connection:
        query = text(
            "SELECT prompt_tokens, completion_tokens FROM usage WHERE conversation_id = :c"
        )
        return [(row[0], row[1]) for row in connection.execute(query, {"c": CID})]


async def test_previous_runs_reach_the_provider(
    function_model: FunctionModel, recap: Recap, received: list[list[ModelMessage]]
) -> None:
    """The no-op case: without ``message_history``, the second run's request holds the first
    run's question and answer, then the new question (Recap holds the history)."""
    history = RecapHistory(CID, recap=recap, enqueue=False)
    agent = Agent(function_model, capabilities=[history])
    await agent.run("Previous question")
    result = await agent.run("New question")
    assert texts(received[-1]) == ["Previous question", "Provider response 1", "New question"]
    assert result.output == "Provider response 2"
    assert [m["content"] for m in recap.export(CID).messages] == [
        "Previous question",
        "Provider response 1",
        "New question",
        "Provider response 2",
    ]


async def test_streamed_runs(
    function_model: FunctionModel, recap: Recap, received: list[list[ModelMessage]]
) -> None:
    """The streamed case: ``run_stream`` records and assembles as ``run`` does."""
    agent = Agent(function_model, capabilities=[RecapHistory(CID, recap=recap, enqueue=False)])
    for prompt in ("Question 1", "Question 2"):
        async with agent.run_stream(prompt) as result:
            async for _ in result.stream_text():
                pass
    assert texts(received[-1]) == ["Question 1", "hello", "Question 2"]


async def test_the_system_prompt_stays_first(
    function_model: FunctionModel, recap: Recap, received: list[list[ModelMessage]]
) -> None:
    """The system prompt is sent in front of Recap's assembly, once."""
    history = RecapHistory(CID, recap=recap, enqueue=False)
    agent = Agent(function_model, system_prompt="SYSTEM", capabilities=[history])
    await agent.run("Hello")
    await agent.run("Again")
    assert texts(received[-1]) == ["SYSTEM", "Hello", "Provider response 1", "Again"]


async def test_as_a_processor_with_finish(
    function_model: FunctionModel, recap: Recap, received: list[list[ModelMessage]]
) -> None:
    """The processor case: ``ProcessHistory(history)``; ``finish(result)`` records the final
    response and its usage."""
    history = RecapHistory(CID, recap=recap, enqueue=False)
    agent = Agent(function_model, capabilities=[ProcessHistory(history)])
    for prompt in ("One", "Two"):
        await history.finish(await agent.run(prompt))
    assert texts(received[-1]) == ["One", "Provider response 1", "Two"]
    assert len(usage_rows(recap)) == 2


async def test_a_tool_loop_is_recorded_and_resent(recap: Recap) -> None:
    """The resumed tool loop: a tool call and its return are stored with their id, and the
    next run's request carries both."""
    seen: list[list[ModelMessage]] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        last = messages[-1].parts[-1]
        if isinstance(last, UserPromptPart) and last.content == "Look it up":
            call = ToolCallPart(tool_name="lookup", args={"key": "A1"}, tool_call_id="call_1")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart(content="done")])

    agent = Agent(FunctionModel(answer), capabilities=[RecapHistory(CID, recap=recap)])

    @agent.tool_plain
    def lookup(key: str) -> str:
        return f"record {key}"

    await agent.run("Look it up")
    await agent.run("Thanks")
    stored = recap.export(CID).messages
    roles = ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert [m["role"] for m in stored] == roles
    assert stored[2]["tool_call_id"] == "call_1" and stored[2]["content"] == "record A1"
    assert "return:record A1" in texts(seen[-1])


async def test_every_model_call_records_its_usage(
    function_model: FunctionModel, recap: Recap, received: list[list[ModelMessage]]
) -> None:
    """One usage row per model call, with the provider's input and output tokens."""
    agent = Agent(function_model, capabilities=[RecapHistory(CID, recap=recap, enqueue=False)])
    for prompt in ("One", "Two", "Three"):
        await agent.run(prompt)
    rows = usage_rows(recap)
    assert len(rows) == len(received) == 3
    assert all(prompt > 0 and completion > 0 for prompt, completion in rows)
    assert recap.stats(CID).calibration != 1.0


def overflow(count: int, window: int) -> ModelHTTPError:
    """The error a provider's context-length refusal becomes in Pydantic AI."""
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages "
        f"resulted in {count} tokens."
    )
    return ModelHTTPError.for_category(
        ModelContextWindowExceededError,
        status_code=400,
        model_name="function",
        body={"message": message, "code": "context_length_exceeded"},
        provider_error_code="context_length_exceeded",
    )


async def test_a_context_overflow_compresses_and_retries_once(recap: Recap) -> None:
    """The provider refuses the request: the conversation is compressed and a different,
    smaller request is sent once; the count the error states is recorded as a reading."""
    sent: list[list[ModelMessage]] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        sent.append(list(messages))
        if len(sent) == 7:  # the seventh run's first attempt
            raise overflow(4_400, 4_000)  # the provider counts more than Recap's estimate
        return ModelResponse(parts=[TextPart(content="answer " + "word " * 150)])

    history = RecapHistory(CID, recap=recap, max_input_tokens=4_000, enqueue=False)
    agent = Agent(FunctionModel(answer), capabilities=[history])
    for turn in range(6):
        await agent.run(f"question {turn} " + "detail " * 150)
    result = await agent.run("the last question")
    assert result.output.startswith("answer")
    assert len(sent) == 8
    assert sent[7] != sent[6] and len(sent[7]) < len(sent[6])
    assert recap.summaries(CID)
    assert 4_400 in [prompt for prompt, _ in usage_rows(recap)]


async def test_the_same_request_is_never_sent_again(recap: Recap) -> None:
    """Nothing to compress (one message): the provider's error goes on after one attempt."""
    calls: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(len(messages))
        raise overflow(200, 100)

    agent = Agent(FunctionModel(answer), capabilities=[RecapHistory(CID, recap=recap)])
    with pytest.raises(ModelContextWindowExceededError):
        await agent.run("a question")
    assert calls == [1]


async def test_tool_definitions_and_max_tokens_count(recap: Recap) -> None:
    """The request's tool definitions and instructions are counted as its fixed parts, and
    its ``max_tokens`` is kept free for the reply."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(content="ok")])

    history = RecapHistory(CID, recap=recap, max_input_tokens=8_000, enqueue=False)
    agent = Agent(
        FunctionModel(answer),
        instructions="Be brief. " * 40,
        capabilities=[history],
        model_settings={"max_tokens": 700},
    )

    @agent.tool_plain
    def lookup(key: str, detail: str, region: str) -> str:
        """Look an order up by its key; the detail level and the region narrow the search."""
        return key

    await agent.run("Hello")
    stats: Any = recap.stats(CID)
    assert stats.output_reserve == 700
    assert stats.fixed > 120  # the instructions and the tool schema, not the default


RETRY_FEEDBACK = getattr(pydantic_ai.messages, "RetryFeedbackPart", None)


@pytest.mark.skipif(RETRY_FEEDBACK is None, reason="this Pydantic AI has no RetryFeedbackPart")
@pytest.mark.parametrize("as_processor", [False, True], ids=["capability", "processor"])
async def test_an_output_retry_keeps_its_feedback_in_the_next_run(
    recap: Recap, as_processor: bool
) -> None:
    """An output validator's ``ModelRetry`` (Pydantic AI's ``RetryFeedbackPart``) is stored and
    comes back as that part, between the rejected answer and the accepted one, as it does in
    the run's own history; a tool call retried (``ToolReturnPart(outcome="retried")``) keeps its
    outcome. Before, the feedback was not stored, and the next run's model saw its rejected and
    accepted answers as two responses in a row."""
    seen: list[list[ModelMessage]] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        last = messages[-1].parts[-1]
        said = str(getattr(last, "content", ""))
        if isinstance(last, UserPromptPart) and said == "Fetch it":
            call = ToolCallPart(tool_name="fetch", args={"key": "A1"}, tool_call_id="call_1")
            return ModelResponse(parts=[call])
        if getattr(last, "tool_call_id", None) == "call_1":  # the retried call's answer
            call = ToolCallPart(tool_name="fetch", args={"key": "A2"}, tool_call_id="call_2")
            return ModelResponse(parts=[call])
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(content="draft")])
        if "that is a draft" in said:  # the feedback, in the voice the model is shown it
            return ModelResponse(parts=[TextPart(content="final")])
        return ModelResponse(parts=[TextPart(content="ok")])

    history = RecapHistory(CID, recap=recap)
    capability = ProcessHistory(history) if as_processor else history
    agent = Agent(FunctionModel(answer), capabilities=[capability], retries=2)

    @agent.tool_plain(retries=2)
    def fetch(key: str) -> str:
        if key == "A1":
            raise ModelRetry("no record A1, try A2")
        return f"record {key}"

    @agent.output_validator
    def not_a_draft(output: str) -> str:
        if output == "draft":
            raise ModelRetry("that is a draft")
        return output

    first = await agent.run("Fetch it")
    assert first.output == "final"
    if as_processor:
        await history.finish(first)
    await agent.run("Thanks")

    def shown(messages: list[ModelMessage]) -> list[tuple[str, str]]:
        return [
            (
                type(part).__name__,
                str(part.args_as_dict())
                if isinstance(part, ToolCallPart)
                else str(getattr(part, "content", "")),
            )
            for message in messages
            for part in message.parts
        ]

    assert any(isinstance(p, RETRY_FEEDBACK) for m in first.all_messages() for p in m.parts)
    final_request = seen[-2]  # what the model was shown when it answered "final"
    assert "that is a draft" in str(shown(final_request))
    # the next run's model is shown the first run as it was: feedback, retried call and all
    assert shown(seen[-1])[: len(shown(final_request))] == shown(final_request)
    stored = recap.export(CID).messages
    kept = [m["pydantic_ai_part"]["part_kind"] for m in stored if "pydantic_ai_part" in m]
    assert kept == ["tool-return", "retry-feedback"]
