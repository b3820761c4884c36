"""Opt-in Prometheus metrics of the host API: ``recap.enable_metrics(registry)``.

Until a host enables them, ``Recap.assemble`` pays one attribute check; enabled, each assembly
records its time, and whether (and how many stored tokens of) older history it left out to fit,
in the registry the host gives (default: ``prometheus_client``'s global ``REGISTRY``, the one
its ``start_http_server`` and ``make_asgi_app`` expose).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class HostMetrics:
    seconds: Any
    truncated: Any
    left_out: Any


_enabled: list[HostMetrics] = []  # at most one: the registry ``enable_metrics`` was given


def enable_metrics(registry: Any = None) -> None:
    """Record every ``Recap.assemble`` of this process in ``registry`` (a
    ``prometheus_client.CollectorRegistry``; default: the global one). Enabling again moves the
    metrics to the new registry."""
    from prometheus_client import REGISTRY, Counter, Histogram

    target = registry if registry is not None else REGISTRY
    _enabled[:] = [
        HostMetrics(
            seconds=Histogram(
                "recap_assemble_seconds", "Time Recap.assemble took",
                buckets=SECONDS, registry=target,
            ),
            truncated=Counter(
                "recap_assemble_truncated", "Assemblies that left older history out to fit",
                registry=target,
            ),
            left_out=Counter(
                "recap_assemble_left_out_tokens", "Stored tokens of older history left out",
                registry=target,
            ),
        )
    ]  # fmt: skip


def started() -> float:
    """The clock at an assembly's start (0 when metrics are off: nothing is read)."""
    return time.perf_counter() if _enabled else 0.0


def assembled(since: float, request: Any) -> None:
    """An assembly ended: its time, and its truncation."""
    if not _enabled or not since:
        return
    metrics = _enabled[0]
    metrics.seconds.observe(time.perf_counter() - since)
    if request.truncated:
        metrics.truncated.inc()
        metrics.left_out.inc(request.truncated_tokens)
