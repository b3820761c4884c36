"""Prometheus metrics of a worker process (``RECAP_WORKER_METRICS_PORT``).

Every process that runs tasks serves its own metrics over HTTP: a threads or solo worker on
the port itself, each child of a prefork pool on the first free port after it (the port is
logged as ``worker_metrics_listening``). The run's events (``workers.events``) count runs by
action and outcome and their durations; the model client counts summarizer calls and tokens;
the task counts retries and the time a compression waited on its queue (the lag: the
``recap_enqueued_at`` header ``workers.enqueue.send`` sets).
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from recap.workers.queues import ENQUEUED_HEADER

log = structlog.get_logger(__name__)

PORTS_TRIED = 64  # a prefork child tries this many ports after the base one
SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

registry = CollectorRegistry(auto_describe=True)
runs = Counter(
    "recap_worker_runs", "Compression runs ended, by action and outcome",
    ["action", "outcome"], registry=registry,
)  # fmt: skip
run_seconds = Histogram(
    "recap_worker_run_duration_seconds", "Time a compression run took, by action",
    ["action"], buckets=SECONDS, registry=registry,
)  # fmt: skip
failures = Counter("recap_worker_failed_runs", "Compression runs that failed", registry=registry)
tokens_saved = Counter(
    "recap_worker_saved_tokens", "Tokens a summarized run took off its conversation",
    registry=registry,
)  # fmt: skip
summarizer_calls = Counter(
    "recap_worker_summarizer_calls", "Summary model calls, by outcome (ok, error)",
    ["outcome"], registry=registry,
)  # fmt: skip
summarizer_tokens = Counter(
    "recap_worker_summarizer_tokens", "Summary model tokens, by direction (input, output)",
    ["direction"], registry=registry,
)  # fmt: skip
retries = Counter("recap_worker_retries", "Compression tasks sent back to retry", registry=registry)
provider_compactions = Counter(
    "recap_worker_provider_compactions",
    "Provider compactions asked by a run (RECAP_PROVIDER_COMPACTION), by outcome (ok, failed)",
    ["outcome"], registry=registry,
)  # fmt: skip
queue_wait = Histogram(
    "recap_worker_queue_wait_seconds", "Time a compression waited on its queue",
    buckets=SECONDS, registry=registry,
)  # fmt: skip
lag = Gauge(
    "recap_worker_queue_lag_seconds",
    "Age of the compression this process took last, when it took it (its queue's oldest)",
    registry=registry,
)  # fmt: skip
over_trigger = Gauge(
    "recap_worker_conversations_over_trigger",
    "Conversations over their trigger with no live run, found by the last reconcile pass",
    registry=registry,
)  # fmt: skip

_listening: list[int] = []


def event(name: str, fields: dict[str, Any]) -> None:
    """A run's event (``core.compression.report``): its end counts the run."""
    from recap.core.compression.report import COMPLETED, FAILED, PROVIDER_COMPACTION

    if name == PROVIDER_COMPACTION:
        provider_compactions.labels(str(fields.get("outcome") or "unknown")).inc()
        return
    if name not in (COMPLETED, FAILED):
        return
    action = str(fields.get("action") or "unknown")
    runs.labels(action, "failed" if name == FAILED else "completed").inc()
    duration = fields.get("duration_ms")
    if isinstance(duration, int | float):
        run_seconds.labels(action).observe(duration / 1000)
    if name == FAILED:
        failures.inc()
    before, after = fields.get("tokens_before"), fields.get("tokens_after")
    if action == "summarized" and isinstance(before, int) and isinstance(after, int):
        tokens_saved.inc(max(before - after, 0))


def summarizer_call(input_tokens: int, output_tokens: int) -> None:
    summarizer_calls.labels("ok").inc()
    summarizer_tokens.labels("input").inc(input_tokens)
    summarizer_tokens.labels("output").inc(output_tokens)


def summarizer_error() -> None:
    summarizer_calls.labels("error").inc()


def retried() -> None:
    retries.inc()


def taken(request: Any, now: float | None = None) -> None:
    """A compression task starts: how long it waited on its queue (when it was sent with the
    header; a retry's wait counts from its first sending)."""
    sent = getattr(request, ENQUEUED_HEADER, None)
    if sent is None and isinstance(getattr(request, "headers", None), dict):
        sent = request.headers.get(ENQUEUED_HEADER)
    if not isinstance(sent, int | float | str):
        return
    try:
        waited = max((now or time.time()) - float(sent), 0.0)
    except ValueError:
        return
    queue_wait.observe(waited)
    lag.set(waited)


def serve(port: int, *, search: bool) -> int | None:
    """Serve this process's metrics on ``port`` (``search``: or the first free port after it,
    up to ``PORTS_TRIED``); the port, or None when none could be bound (logged)."""
    if _listening:
        return _listening[0]
    last = port + PORTS_TRIED if search else port
    for candidate in range(port, min(last, 65535) + 1):
        try:
            start_http_server(candidate, addr="0.0.0.0", registry=registry)
        except OSError:
            continue
        _listening.append(candidate)
        log.info("worker_metrics_listening", port=candidate)
        return candidate
    log.warning("worker_metrics_unavailable", port=port, error="no free port")
    return None
