"""OpenTelemetry traces across processes, with ``RECAP_TRACING=true`` and OTLP/HTTP to a
collector the test starts on 127.0.0.1 (``tests.support.otlp``), a real ``recap serve`` and a
real Celery worker (threads pool) on one SQLite database and a private Redis database:

- a stored turn through serve continues the client's trace (its W3C ``traceparent``): one
  SERVER span whose children read, assemble, call the upstream (a GenAI ``chat`` span with the
  reply's usage), store, and send the compression, which the worker runs as that send's child;
- a compression enqueued by the test process (the host, its spans in OpenTelemetry's in-memory
  exporter) runs on the worker as the child of the host's ``send compress`` span: its reads,
  the summary model's ``chat`` span and its write.

Each span's values are checked against what the turn and the run really did (the response's
headers and usage, the stored rows, the model server's requests), not only its presence.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.support.llm_server import LLMServer
from tests.support.otlp import Collector, Span, collector, in_memory_tracing
from tests.support.serving import MODEL, Serve, new_id, running_serve

pytestmark = pytest.mark.redis

SERVE_SPANS = {
    "POST /v1/chat/completions",
    "recap.read",
    "recap.assemble",
    "chat stand-in",
    "recap.store",
    "send compress",
}
WORKER_SPANS = {
    "process compress",
    "recap.compress.read_head",  # no leaf given: the two aggregates first
    "recap.compress.read",
    "recap.compress.read_text",
    "chat stand-in",
    "recap.compress.write",
}


@dataclass
class Stack:
    """The worker's side: its database, broker, summary model and process."""

    folder: Path
    db_url: str
    broker: str
    summaries: LLMServer
    worker: Any


@pytest.fixture(scope="module")
def traces() -> Iterator[Collector]:
    with collector() as running:
        yield running


@pytest.fixture(scope="module")
def stack(
    redis_url: str, traces: Collector, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A worker launched first (it starts while serve does), on the module's database."""
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.support.services import redis_database
    from tests.support.worker_stack import CELERY, WorkerProcess, worker_env

    folder: Path = tmp_path_factory.mktemp("tracing")
    db_url = f"sqlite:///{folder / 'recap.db'}"
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    with redis_database(redis_url) as broker:
        summaries = LLMServer().start()
        env = worker_env(
            RECAP_DATABASE_URL=db_url,
            RECAP_BROKER_URL=broker,
            RECAP_RESULT_BACKEND=broker,
            RECAP_SUMMARY_MODEL="openai/stand-in",
            RECAP_SUMMARY_API_BASE=summaries.url,
            RECAP_SUMMARY_API_KEY="sk-tracing-test-key-0123",
            RECAP_OUTPUT_DIR=str(folder / "outputs"),
            **traces.env("recap-worker"),
        )
        args = ("--pool", "threads", "--concurrency", "2", "--queues", "compress", "-l", "INFO")
        worker = WorkerProcess(env, folder / "worker.log", args, program=CELERY).launch()
        try:
            yield Stack(folder, db_url, broker, summaries, worker)
        finally:
            worker.stop()
            summaries.stop()


@pytest.fixture(scope="module")
def serve(llm: LLMServer, stack: Stack, traces: Collector) -> Iterator[Serve]:
    env = {**traces.env("recap-serve"), "RECAP_BROKER_URL": stack.broker}
    with running_serve(stack.db_url, stack.folder, llm, **env) as running:
        yield running


def one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {len(found)} spans"
    return found[0]


def log_lines(path: Path, event: str) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text().splitlines():
        if event in text and text.startswith("{"):
            lines.append(json.loads(text))
    return lines


def test_a_serve_turn_is_one_trace_from_the_client(
    serve: Serve, stack: Stack, traces: Collector
) -> None:
    from opentelemetry import propagate, trace

    stack.worker.wait_ready(1)
    cid = new_id()
    with in_memory_tracing() as exporter:
        with trace.get_tracer("test").start_as_current_span("client turn") as client_span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            raw = serve.client().chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "what is in src/app.py?"}],
                extra_headers={**carrier, "X-Recap-Conversation": cid},
            )
        (client,) = exporter.get_finished_spans()
    completion = raw.parse()
    trace_id = format(client_span.get_span_context().trace_id, "032x")
    found = traces.wait_for(trace_id, SERVE_SPANS)
    # the worker's spans join the trace as soon as it runs the compression serve enqueued
    assert {s.service for s in found} <= {"recap-serve", "recap-worker"}
    spans = [s for s in found if s.service == "recap-serve"]

    server = one(spans, "POST /v1/chat/completions")
    assert server.parent_id == format(client.context.span_id, "016x")  # the client's trace
    assert server.kind == "SERVER"
    assert server.attributes["http.route"] == "/v1/chat/completions"
    assert server.attributes["http.response.status_code"] == 200
    children = {s.name: s for s in spans if s.parent_id == server.span_id}
    assert set(children) == SERVE_SPANS - {server.name}

    read, assembled = children["recap.read"], children["recap.assemble"]
    assert read.attributes["recap.conversation_id"] == cid
    assert (read.attributes["recap.matched"], read.attributes["recap.appended"]) == (0, 1)
    assert assembled.attributes["recap.conversation_id"] == cid
    tokens = int(raw.headers["X-Recap-Request-Tokens"])
    assert assembled.attributes["recap.request.tokens"] == tokens
    assert assembled.attributes["recap.truncated"] is False
    assert assembled.attributes["recap.request.messages"] == 1

    chat = children["chat stand-in"]
    assert chat.kind == "CLIENT"
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.request.model"] == "stand-in"
    assert completion.usage is not None
    assert chat.attributes["gen_ai.usage.input_tokens"] == completion.usage.prompt_tokens
    assert chat.attributes["gen_ai.usage.output_tokens"] == completion.usage.completion_tokens
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert chat.attributes["server.port"] == int(serve.llm.url.rsplit(":", 1)[1].split("/")[0])
    assert "gen_ai.input.messages" not in chat.attributes  # never a prompt's text

    store = children["recap.store"]
    reply_row = serve.rows(cid)[-1]
    assert reply_row[2] == "assistant"
    assert store.attributes["recap.reply_id"] == reply_row[0]
    sent = children["send compress"]
    assert sent.kind == "PRODUCER"
    assert sent.attributes["messaging.destination.name"] == "compress"
    assert sent.attributes["recap.conversation_id"] == cid

    # one after the other, inside the request's span
    order = [read, assembled, chat, store, sent]
    assert all(a.end <= b.start for a, b in itertools.pairwise(order))
    assert server.start <= read.start and sent.end <= server.end
    # the turn's log line names the trace
    turn_lines = log_lines(serve.log, "serve_turn")
    (line,) = [entry for entry in turn_lines if entry.get("conversation_id") == cid]
    assert line["trace_id"] == trace_id
    # the compression serve enqueued runs on the worker, in the same trace
    spans = traces.wait_for(trace_id, {"process compress"})
    process = one(spans, "process compress")
    assert process.service == "recap-worker"
    assert process.parent_id == sent.span_id
    assert process.attributes["messaging.message.id"] == sent.attributes["messaging.message.id"]
    assert process.attributes["recap.action"] == "skipped"  # one short turn: nothing to do


def test_a_streamed_calls_span_lasts_the_stream_and_has_its_usage(
    serve: Serve, traces: Collector
) -> None:
    from opentelemetry import propagate, trace

    cid = new_id()
    with (
        in_memory_tracing(),
        trace.get_tracer("test").start_as_current_span("client turn") as client_span,
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        stream = serve.client().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "stream me a few words please"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={**carrier, "X-Recap-Conversation": cid},
        )
        chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None
    trace_id = format(client_span.get_span_context().trace_id, "032x")
    spans = traces.wait_for(trace_id, SERVE_SPANS)
    chat, store = one(spans, "chat stand-in"), one(spans, "recap.store")
    assert chat.attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert chat.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert store.start <= chat.end <= store.end  # ended once the stream's reply was whole
    assert store.attributes["recap.reply_id"] == serve.rows(cid)[-1][0]


def test_a_compression_continues_the_enqueuing_hosts_trace(stack: Stack, traces: Collector) -> None:
    from celery import Celery
    from opentelemetry import trace

    from recap.core import service
    from recap.core.settings import Settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.models import CompactionLog, table_of
    from recap.workers.enqueue import CompressJob, send
    from tests.test_operations import WINDOW, chat

    cid = new_id()
    engine = make_engine(stack.db_url)
    settings = Settings(database_url=stack.db_url)
    service.import_conversations(
        engine, [{"id": cid, "messages": chat(12)}], settings, max_input_tokens=WINDOW
    )
    stack.worker.wait_ready(1)
    app = Celery(broker=stack.broker, backend=stack.broker)
    try:
        with in_memory_tracing() as exporter:
            with trace.get_tracer("test").start_as_current_span("host turn"):
                result = send(app, CompressJob(cid)).get(timeout=90)
            host_spans = {s.name: s for s in exporter.get_finished_spans()}
        assert result["action"] == "summarized"
        sent = host_spans["send compress"]
        assert sent.parent is not None
        assert sent.parent.span_id == host_spans["host turn"].context.span_id
        trace_id = format(sent.context.trace_id, "032x")
        spans = traces.wait_for(trace_id, WORKER_SPANS)
        summary_request = stack.summaries.requests[-1].body
        log = table_of(CompactionLog)
        with engine.connect() as connection:
            row = connection.execute(
                select(log.c.input_tokens, log.c.output_tokens).where(
                    log.c.conversation_id == cid, log.c.action == "summarized"
                )
            ).one()
    finally:
        app.close()
        engine.dispose()
    worker_log = stack.worker.log

    process = one(spans, "process compress")
    assert process.service == "recap-worker"
    assert process.kind == "CONSUMER"
    assert process.parent_id == format(sent.context.span_id, "016x")  # carried in the headers
    assert process.attributes["messaging.message.id"] == sent.attributes["messaging.message.id"]
    assert process.attributes["recap.conversation_id"] == cid
    assert process.attributes["recap.action"] == "summarized"
    assert process.attributes["recap.tokens_before"] == result["tokens_before"]
    assert process.attributes["recap.tokens_after"] == result["tokens_after"]
    children = {s.name for s in spans if s.parent_id == process.span_id}
    assert children == WORKER_SPANS - {"process compress"}

    chat = one(spans, "chat stand-in")
    assert chat.kind == "CLIENT"
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.system"] == "openai"
    assert chat.attributes["gen_ai.request.model"] == "stand-in"
    assert chat.attributes["gen_ai.request.max_tokens"] == summary_request["max_tokens"]
    assert chat.attributes["gen_ai.request.temperature"] == 0.0
    assert (
        chat.attributes["gen_ai.usage.input_tokens"],
        chat.attributes["gen_ai.usage.output_tokens"],
    ) == tuple(row)
    assert chat.attributes["gen_ai.usage.input_tokens"] > 0
    read, write = one(spans, "recap.compress.read"), one(spans, "recap.compress.write")
    assert read.end <= chat.start and chat.end <= write.start  # read, call, write
    # the run's log lines name the trace
    lines = [e for e in log_lines(worker_log, "compress") if e.get("conversation_id") == cid]
    assert lines and all(e.get("trace_id") == trace_id for e in lines if "span_id" in e)
    assert any(e.get("trace_id") == trace_id for e in lines)
