"""OpenTelemetry in Recap's own processes: ``recap serve`` and the workers (``RECAP_TRACING``).

With ``RECAP_TRACING=true`` a process sets an SDK tracer provider that batches its spans to an
OTLP/HTTP collector, configured by OpenTelemetry's own variables: ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; default ``http://localhost:4318``), its headers,
``OTEL_TRACES_SAMPLER``, ``OTEL_RESOURCE_ATTRIBUTES``, and ``OTEL_SERVICE_NAME`` (default
``recap-serve`` or ``recap-worker``). A provider the process already has (one set by
``opentelemetry-instrument``) is kept, and receives Recap's spans. Without the ``recap[otel]``
extra the setting logs one warning and nothing is traced.

A compression task continues the trace of whoever enqueued it: ``workers.enqueue.send`` puts the
W3C ``traceparent`` in the message's headers, and ``task_span`` makes the task's CONSUMER span
its child. This is done here with OpenTelemetry's propagation API, not with
``opentelemetry-instrumentation-celery``: that package spans every task and publish of every app
through Celery's signals, which Recap does not need for its one task and its one send path.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import structlog

import recap.core.tracing as tracing
from recap.core.settings import Settings
from recap.workers.queues import COMPRESS_QUEUE

log = structlog.get_logger(__name__)
PROPAGATED = ("traceparent", "tracestate")  # the W3C trace context headers


def configure(settings: Settings, service: str) -> bool:
    """Set this process's tracer provider when ``RECAP_TRACING`` asks for it (once); whether
    spans are recorded."""
    if not settings.tracing:
        return False
    if tracing.enabled():  # set already: by an earlier call, a fork's parent, or the host
        return True
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "tracing_unavailable",
            error=f"{exc.name or 'opentelemetry'} is not installed: pip install 'recap[otel]'",
        )
        return False
    name = os.environ.get("OTEL_SERVICE_NAME") or service  # the variable wins, as in the SDK
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing_enabled", service=name, endpoint=_endpoint())
    return True


def flush(timeout_ms: int = 5000) -> None:
    """Send the spans still batched (at a process's shutdown: the SDK's own exit hook runs only
    when the interpreter exits cleanly)."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return
    force = getattr(api.get_tracer_provider(), "force_flush", None)
    if force is not None:
        force(timeout_ms)


def _endpoint() -> str:
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


def carried(request: Any) -> dict[str, str]:
    """The trace context a task's message carries (Celery puts a message's custom headers on
    its request, or in ``request.headers``)."""
    found: dict[str, str] = {}
    headers = getattr(request, "headers", None)
    for name in PROPAGATED:
        value = getattr(request, name, None)
        if value is None and isinstance(headers, dict):
            value = headers.get(name)
        if isinstance(value, str):
            found[name] = value
    return found


def task_span(request: Any, conversation_id: str, queue: str = COMPRESS_QUEUE) -> Any:
    """The CONSUMER span of one task on ``queue`` (a compression, or a memory extraction on
    the memory queue), the child of its sender's span when the message carries one
    (``QUIET`` when tracing is off)."""
    if not tracing.enabled():
        return tracing.QUIET
    attributes = {
        "messaging.system": "celery",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": str(getattr(request, "id", "") or ""),
        "recap.conversation_id": conversation_id,
        "recap.attempt": int(getattr(request, "retries", 0) or 0),
    }
    parent = tracing.extract(carried(request))
    return tracing.span(f"process {queue}", attributes, kind=tracing.CONSUMER, context=parent)


def outcome(span: Any, result: Any) -> None:
    """The run's outcome on its task span."""
    if not isinstance(result, dict) or not span.is_recording():
        return
    values = {
        "recap.action": result.get("action"),
        "recap.tokens_before": result.get("tokens_before"),
        "recap.tokens_after": result.get("tokens_after"),
    }
    span.set_attributes({k: v for k, v in values.items() if isinstance(v, str | int)})
    if result.get("action") == "failed":
        tracing.error_status(span, "the run failed")
