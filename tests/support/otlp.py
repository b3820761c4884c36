"""Traces in the tests: a small OTLP/HTTP collector on 127.0.0.1 that another process (``recap
serve``, a worker) exports its spans to, as it would to a real collector, and the test process's
own tracer provider with OpenTelemetry's in-memory exporter (the enqueuing host's side).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass(frozen=True)
class Span:
    """A span as a collector received it (ids in hex, as trace backends show them)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    service: str
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    start: int
    end: int


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def spans_of(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    found: list[Span] = []
    for resource in request.resource_spans:
        resource_attributes = {a.key: _value(a.value) for a in resource.resource.attributes}
        service = str(resource_attributes.get("service.name", ""))
        for scope in resource.scope_spans:
            for span in scope.spans:
                found.append(
                    Span(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        kind=KINDS.get(span.kind, str(span.kind)),
                        service=service,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        status=span.status.code,
                        start=span.start_time_unix_nano,
                        end=span.end_time_unix_nano,
                    )
                )
    return found


@dataclass
class Collector:
    """An OTLP/HTTP (protobuf) trace collector: ``POST /v1/traces``; what it received."""

    spans: list[Span] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def env(self, service: str) -> dict[str, str]:
        """A process's environment to export here, soon after each span ends."""
        return {
            "RECAP_TRACING": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_SERVICE_NAME": service,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }

    def start(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                collector.spans.extend(spans_of(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in list(self.spans) if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout: float = 30.0) -> list[Span]:
        """The trace's spans once every name in ``names`` has arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if names <= {s.name for s in spans}:
                return spans
            time.sleep(0.05)
        seen = sorted({s.name for s in self.trace(trace_id)})
        raise AssertionError(f"spans {sorted(names)} of trace {trace_id} not all received: {seen}")


@contextmanager
def collector() -> Iterator[Collector]:
    running = Collector().start()
    try:
        yield running
    finally:
        running.stop()


@contextmanager
def in_memory_tracing() -> Iterator[Any]:
    """This process's spans recorded in memory (``InMemorySpanExporter``), as the global tracer
    provider while the block runs; OpenTelemetry's globals put back afterwards, so the rest of
    the suite runs untraced (the API allows one provider per process: its set-once guard is
    reset, as OpenTelemetry's own tests do)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.util._once import Once

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER = before
        trace._TRACER_PROVIDER_SET_ONCE = Once()
