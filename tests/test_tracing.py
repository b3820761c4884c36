"""OpenTelemetry spans in one process, with OpenTelemetry's in-memory exporter: the host API's
``assemble`` (``Recap`` and ``AsyncRecap``, whose thread pool keeps the caller's span), the trace
ids in log lines, the trace carried in a task's headers; with no provider set, nothing is
recorded and every call is the shared no-op. The GenAI provider names and the server of a base
URL, table-driven."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import recap
from recap.core import tracing
from recap.core.settings import Settings
from recap.workers import tracing as worker_tracing
from tests.support.otlp import in_memory_tracing
from tests.test_metrics_host import history


def test_without_a_provider_nothing_is_recorded() -> None:
    assert not tracing.enabled()
    assert tracing.span("x") is tracing.QUIET
    assert tracing.model_call("openai/gpt-4o") is tracing.QUIET
    assert tracing.start("x") is tracing.QUIET
    with tracing.span("x", {"a": 1}) as span:
        span.set_attribute("b", 2)
        assert not span.is_recording()
    carrier: dict[str, Any] = {}
    tracing.inject(carrier)
    assert carrier == {}
    assert tracing.add_trace_ids(None, "info", {"event": "e"}) == {"event": "e"}
    assert worker_tracing.task_span(SimpleNamespace(id="t"), "c") is tracing.QUIET
    # RECAP_TRACING off: serve and the workers set no provider
    assert not worker_tracing.configure(Settings(), "recap-test")
    assert not tracing.enabled()


def test_off_recap_never_imports_opentelemetry() -> None:
    """A process that sets no provider pays no import of the API (nor of its propagators) for
    Recap's spans, model calls, log lines and enqueue headers."""
    import subprocess
    import sys

    script = """
import sys
from recap.core import tracing
with tracing.span("recap.assemble", {"a": 1}) as span:
    span.set_attribute("b", 2)
tracing.model_call("openai/gpt-4o").end()
headers = {}
tracing.inject(headers)
event = tracing.add_trace_ids(None, "info", {"event": "e"})
print(headers, event, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{} {'event': 'e'} []"


def test_assemble_spans_say_what_the_request_is(tmp_path: Path) -> None:
    from opentelemetry import trace

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'recap.db'}")
    host = recap.Recap(settings, create_schema=True)
    host.new("short", max_input_tokens=8_000)
    host.new("long", max_input_tokens=2_000)
    host.add_many("short", history(1))
    host.add_many("long", history(60))
    aio = recap.AsyncRecap(host)
    try:
        with in_memory_tracing() as exporter:
            with trace.get_tracer("test").start_as_current_span("host turn"):
                short = host.assemble("short")
                long = asyncio.run(aio.assemble("long"))  # on the pool's thread
            spans = exporter.get_finished_spans()
    finally:
        aio.close()
        host.engine.dispose()
    parent = next(s for s in spans if s.name == "host turn")
    assembled = [s for s in spans if s.name == "recap.assemble"]
    assert len(assembled) == 2
    for span, request, cid in zip(assembled, (short, long), ("short", "long"), strict=True):
        assert span.parent is not None and span.parent.span_id == parent.context.span_id
        assert span.context.trace_id == parent.context.trace_id
        attributes = dict(span.attributes or {})
        assert attributes["recap.conversation_id"] == cid
        assert attributes["recap.request.tokens"] == request.tokens.total
        assert attributes["recap.request.budget"] == request.budget
        assert attributes["recap.request.window"] == request.window
        assert attributes["recap.request.messages"] == len(request.messages)
        assert attributes["recap.truncated"] is request.truncated
        assert attributes["recap.truncated_tokens"] == request.truncated_tokens
        assert attributes["recap.dropped_messages"] == len(request.dropped_message_ids)
    assert not short.truncated and long.truncated  # both sides of the flag were seen
    assert not tracing.enabled()  # the globals are back: the rest of the suite is untraced


def test_log_lines_and_task_headers_carry_the_current_trace() -> None:
    from opentelemetry import trace

    from recap.workers.logs import _shared_processors

    assert tracing.add_trace_ids in _shared_processors()
    with in_memory_tracing() as exporter:
        with trace.get_tracer("test").start_as_current_span("host turn") as host:
            event = tracing.add_trace_ids(None, "info", {"event": "e"})
            headers: dict[str, Any] = {"recap_enqueued_at": 1.0}
            tracing.inject(headers)
        ids = host.get_span_context()
        # the worker side: the message's headers, as Celery puts them on the task's request
        request = SimpleNamespace(id="task-1", retries=2, headers={}, **headers)
        with worker_tracing.task_span(request, "conv-1") as task:
            worker_tracing.outcome(task, {"action": "failed", "tokens_before": 9})
        finished = {s.name: s for s in exporter.get_finished_spans()}
    trace_id, span_id = format(ids.trace_id, "032x"), format(ids.span_id, "016x")
    assert event == {"event": "e", "trace_id": trace_id, "span_id": span_id}
    version, carried_trace, carried_span, flags = headers["traceparent"].split("-")
    assert (version, carried_trace, carried_span) == ("00", trace_id, span_id)
    assert int(flags, 16) & 1  # sampled
    consumer = finished["process compress"]
    assert consumer.parent is not None and consumer.parent.span_id == ids.span_id
    assert consumer.context.trace_id == ids.trace_id
    assert consumer.kind == trace.SpanKind.CONSUMER
    attributes = dict(consumer.attributes or {})
    assert attributes["messaging.message.id"] == "task-1"
    assert attributes["recap.attempt"] == 2
    assert attributes["recap.action"] == "failed" and attributes["recap.tokens_before"] == 9
    assert consumer.status.status_code == trace.StatusCode.ERROR
    # a message without a trace starts its own
    assert worker_tracing.carried(SimpleNamespace(headers={"traceparent": 5})) == {}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("openai/gpt-4o", ("openai", "gpt-4o")),
        ("gpt-4o-mini", ("openai", "gpt-4o-mini")),
        ("anthropic/claude-sonnet-4-5", ("anthropic", "claude-sonnet-4-5")),
        ("claude-3-5-haiku", ("anthropic", "claude-3-5-haiku")),
        ("gemini/gemini-2.5-pro", ("gcp.gemini", "gemini-2.5-pro")),
        ("vertex_ai/gemini-2.5-pro", ("gcp.vertex_ai", "gemini-2.5-pro")),
        ("bedrock/anthropic.claude-3", ("aws.bedrock", "anthropic.claude-3")),
        ("azure/my-deployment", ("azure.ai.openai", "my-deployment")),
        ("mistral/mistral-large", ("mistral_ai", "mistral-large")),
        ("deepseek-chat", ("deepseek", "deepseek-chat")),
        ("openrouter/meta/llama-3", ("openrouter", "meta/llama-3")),
    ],
)
def test_genai_provider_names(model: str, expected: tuple[str, str]) -> None:
    assert tracing.genai_provider(model) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8123/v1", ("127.0.0.1", 8123)),
        ("https://api.openai.com/v1", ("api.openai.com", 443)),
        ("http://models.internal", ("models.internal", 80)),
        (None, None),
        ("", None),
        ("http://[::1]:99999", None),  # an invalid port
        ("not a url", None),
    ],
)
def test_server_of_a_base_url(url: str | None, expected: tuple[str, int] | None) -> None:
    assert tracing.server_of(url) == expected


def test_a_model_call_span_in_memory() -> None:
    with in_memory_tracing() as exporter:
        call = tracing.model_call(
            "anthropic/claude-x", max_tokens=100, temperature=0, conversation_id="c1",
            server=("h", 1),
        )  # fmt: skip
        tracing.replied(
            call, input_tokens=12, output_tokens=True, response_id="r1", finish_reasons=["stop"]
        )
        call.end()
        (span,) = exporter.get_finished_spans()
    assert span.name == "chat claude-x"
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.system": "anthropic",
        "gen_ai.request.model": "claude-x",
        "gen_ai.request.max_tokens": 100,
        "gen_ai.request.temperature": 0.0,
        "gen_ai.conversation.id": "c1",
        "server.address": "h",
        "server.port": 1,
        "gen_ai.usage.input_tokens": 12,  # output_tokens=True is no count: left out
        "gen_ai.response.id": "r1",
        "gen_ai.response.finish_reasons": ("stop",),
    }


@pytest.mark.parametrize("client", ["direct", "litellm"])
def test_the_upstream_request_carries_the_model_call_span(client: str) -> None:
    """With tracing on, serve's upstream HTTP request carries its model-call span as W3C
    ``traceparent``, on both clients: the model server (or the gateway before it) continues the
    trace under that span. With tracing off, no such header goes out."""
    from opentelemetry import trace

    from recap.workers.serve import upstream
    from tests.support.llm_server import LLMServer

    server = LLMServer().start()
    settings = Settings(
        upstream_api_base=server.url, upstream_api_key="k", upstream_client=client
    )  # fmt: skip
    messages = [{"role": "user", "content": "hello"}]

    async def call() -> None:
        up = upstream.Upstream(settings)
        try:
            await up.complete("openai/stand-in", messages, {}, stream=False)
        finally:
            await up.aclose()

    try:
        asyncio.run(call())  # untraced
        with in_memory_tracing() as exporter:
            asyncio.run(call())
            (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    finally:
        server.stop()
    untraced, traced = ({k.lower(): v for k, v in r.headers.items()} for r in server.requests)
    assert "traceparent" not in untraced
    version, trace_id, span_id, flags = traced["traceparent"].split("-")
    context = span.context
    assert (version, trace_id, span_id) == (
        "00",
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    )
    assert int(flags, 16) & 1  # sampled
    assert span.kind == trace.SpanKind.CLIENT


def test_a_memory_task_continues_its_enqueuers_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """``send_memory`` sends in a PRODUCER span under the enqueuer's and puts its trace in the
    message's headers; ``recap.extract_memories`` (run eagerly with those headers, its core
    run stood in for) makes its CONSUMER span that span's child, in the same trace."""
    from opentelemetry import trace

    from recap.workers import enqueue, tasks
    from recap.workers import memory as memory_task

    sent: dict[str, Any] = {}

    class Broker:
        def send_task(self, name: str, **options: Any) -> Any:
            sent.update(options, name=name)
            return SimpleNamespace(id="memory-1")

    monkeypatch.setattr(memory_task, "extract_memories", lambda *a, **k: {"action": "none"})
    monkeypatch.setattr(tasks, "engine", lambda: None)
    with in_memory_tracing() as exporter:
        with trace.get_tracer("test").start_as_current_span("serve turn") as turn:
            enqueue.send_memory(Broker(), enqueue.MemoryJob("user-1", "conv-1", 7))
        task: Any = memory_task.extract_memories_task
        result = task.apply(args=sent["args"], kwargs=sent["kwargs"], headers=sent["headers"])
        finished = {s.name: s for s in exporter.get_finished_spans()}
    assert result.status == "SUCCESS"
    producer, consumer = finished["send memory"], finished["process memory"]
    assert (
        producer.parent is not None and producer.parent.span_id == turn.get_span_context().span_id
    )
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
    assert consumer.context.trace_id == turn.get_span_context().trace_id
    assert consumer.kind == trace.SpanKind.CONSUMER
    assert dict(consumer.attributes or {})["messaging.destination.name"] == "memory"
