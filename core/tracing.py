"""OpenTelemetry spans of Recap (the ``recap[otel]`` extra), free when they are not wanted.

Recap's code speaks only the OpenTelemetry API: its spans join the tracer provider the process
has set (a host's own, or the one ``recap serve`` and the workers set with ``RECAP_TRACING``).
When ``opentelemetry-api`` is not installed, or no provider has been set (nothing in the
process imported the API, or it holds the API's default proxy or its no-op provider), ``span``
hands back one shared do-nothing object: a span costs a function call and a dictionary lookup,
no attribute is computed (callers ask ``is_recording()``), and Recap never imports the API.

The model calls follow OpenTelemetry's GenAI semantic conventions (``model_call``): a CLIENT
span named ``chat {model}`` with ``gen_ai.operation.name``, ``gen_ai.provider.name`` (and the
older ``gen_ai.system``), ``gen_ai.request.model``, the reply's ``gen_ai.usage.input_tokens``
and ``gen_ai.usage.output_tokens``; never a prompt or a reply's text.

``inject`` and ``extract`` carry a trace in a carrier dict (W3C ``traceparent``): the enqueue
helper puts the sender's trace in a compression task's headers, the task continues it.
``add_trace_ids`` is a structlog processor: the current span's ``trace_id`` and ``span_id`` in
each log line (Recap's logging has it; a host may add it to its own chain).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

TRACER_NAME = "recap"
INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER = (
    "INTERNAL",
    "SERVER",
    "CLIENT",
    "PRODUCER",
    "CONSUMER",
)

# gen_ai.provider.name's well-known values, by litellm's provider prefix of a model string
GENAI_PROVIDERS = {
    "openai": "openai",
    "text-completion-openai": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "vertex_ai": "gcp.vertex_ai",
    "bedrock": "aws.bedrock",
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "mistral": "mistral_ai",
    "groq": "groq",
    "deepseek": "deepseek",
    "xai": "x_ai",
    "cohere": "cohere",
    "cohere_chat": "cohere",
    "perplexity": "perplexity",
    "watsonx": "ibm.watsonx.ai",
}


class _Quiet:
    """The span when tracing is off: every call does nothing."""

    __slots__ = ()

    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        return None

    def record_exception(self, exception: BaseException, **_: Any) -> None:
        return None

    def set_status(self, *_: Any, **__: Any) -> None:
        return None

    def end(self, *_: Any) -> None:
        return None


QUIET = _Quiet()
_state: dict[str, Any] = {}  # "api": the opentelemetry.trace module (or None); the tracer cached


def _api() -> Any:
    """The ``opentelemetry.trace`` module once something in the process has imported it (a
    provider can only be set through it), else None: Recap never pays the API's import (a
    tenth of a second, more for its propagators) to find that nothing is traced. A provider
    named by ``OTEL_PYTHON_TRACER_PROVIDER`` is the exception: the API is imported to load it."""
    api = _state.get("api")
    if api is None:
        api = sys.modules.get("opentelemetry.trace")
        if api is None and _named():
            try:
                from opentelemetry import trace as api
            except ImportError:  # the extra is not installed
                return None
        if api is not None:
            _state["api"] = api
    return api


def _named() -> bool:
    if "named" not in _state:
        _state["named"] = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
    return bool(_state["named"])


def tracer() -> Any:
    """Recap's tracer from the process's provider; None when there is none to record to."""
    api = _api()
    if api is None:
        return None
    # The global the API sets once, read directly: ``get_tracer_provider()`` looks up an
    # environment variable on every call while none is set, the cost of tracing when it is off
    # (a provider named by OTEL_PYTHON_TRACER_PROVIDER is loaded by that call).
    provider = getattr(api, "_TRACER_PROVIDER", None)
    if provider is None:
        if not _named():
            return None
        provider = api.get_tracer_provider()
    if isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
        return None
    if _state.get("provider") is not provider:
        _state["tracer"] = provider.get_tracer(TRACER_NAME, _version())
        _state["provider"] = provider
    return _state["tracer"]


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("recap")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return None


def enabled() -> bool:
    """Whether spans are recorded in this process now."""
    return tracer() is not None


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: str = INTERNAL,
    context: Any = None,
) -> Any:
    """A context manager: a span made current while it runs (``QUIET`` when tracing is off);
    an exception leaving it is recorded and sets its status to error. ``context``: the parent
    (an ``extract``-ed one), instead of the current span."""
    traced = tracer()
    if traced is None:
        return QUIET
    return traced.start_as_current_span(
        name, context=context, kind=_api().SpanKind[kind], attributes=attributes
    )


def start(name: str, attributes: Mapping[str, Any] | None = None, *, kind: str = INTERNAL) -> Any:
    """A span started as a child of the current one but not made current (``end()`` it);
    ``QUIET`` when tracing is off."""
    traced = tracer()
    if traced is None:
        return QUIET
    return traced.start_span(name, kind=_api().SpanKind[kind], attributes=attributes)


@contextmanager
def current(started: Any) -> Iterator[Any]:
    """``started`` (from ``start``) made current while the block runs, left open after it."""
    if started is QUIET:
        yield started
        return
    with _api().use_span(started, end_on_exit=False):
        yield started


def traced(name: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A decorator: each call of the function in a span ``name``."""

    def wrap(func: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(func)
        def inner(*args: P.args, **kwargs: P.kwargs) -> T:
            if tracer() is None:
                return func(*args, **kwargs)
            with span(name):
                return func(*args, **kwargs)

        return inner

    return wrap


def failed(started: Any, exc: BaseException) -> None:
    """Mark ``started`` as failed by ``exc`` (its class as ``error.type``)."""
    if started is QUIET or not started.is_recording():
        return
    from opentelemetry.trace import Status, StatusCode

    started.record_exception(exc)
    started.set_attribute("error.type", type(exc).__name__)
    started.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def error_status(started: Any, description: str) -> None:
    """Set ``started``'s status to error (an HTTP 5xx answer, a failed run)."""
    if started is QUIET or not started.is_recording():
        return
    from opentelemetry.trace import Status, StatusCode

    started.set_status(Status(StatusCode.ERROR, description))


# --- the trace carried across a queue -----------------------------------------------------------


def inject(carrier: MutableMapping[str, Any]) -> None:
    """The current trace put into ``carrier`` (``traceparent``, ``tracestate``), when a span is
    current; nothing otherwise (and the propagators are never loaded), or without
    OpenTelemetry."""
    api = _api()
    if api is None or not api.get_current_span().get_span_context().is_valid:
        return
    from opentelemetry import propagate

    propagate.inject(carrier)


def inject_span(started: Any, carrier: MutableMapping[str, Any]) -> None:
    """The trace of ``started`` (a span not made current, as ``model_call``'s) put into
    ``carrier`` as W3C ``traceparent`` (and ``tracestate``): what an outgoing HTTP request
    carries so that the server it calls continues the trace under that span. Nothing when
    ``started`` records nothing (tracing off: ``QUIET``)."""
    if _api() is None or not started.is_recording():
        return
    from opentelemetry import propagate, trace

    propagate.inject(carrier, context=trace.set_span_in_context(started))


def extract(carrier: Mapping[str, Any]) -> Any:
    """The trace context ``carrier`` carries (None without OpenTelemetry or a trace)."""
    if _api() is None or "traceparent" not in carrier:
        return None
    from opentelemetry import propagate

    return propagate.extract({k: v for k, v in carrier.items() if isinstance(v, str)})


def add_trace_ids(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: ``trace_id`` and ``span_id`` (hex, as trace backends show them) of
    the span current where the line is logged, when one is."""
    api = _api()
    if api is None:
        return event
    found = api.get_current_span().get_span_context()
    if found.is_valid:
        event.setdefault("trace_id", format(found.trace_id, "032x"))
        event.setdefault("span_id", format(found.span_id, "016x"))
    return event


# --- model calls, by the GenAI semantic conventions ---------------------------------------------


def genai_provider(model: str) -> tuple[str, str]:
    """(``gen_ai.provider.name``, the model's name as the provider knows it) of a litellm
    model string: its provider prefix mapped to the conventions' value, or its family
    (``core.counting.providers``) when it has none."""
    prefix, _, rest = model.partition("/")
    if rest:
        return GENAI_PROVIDERS.get(prefix, prefix), rest
    from recap.core.counting.providers import provider_of

    family = provider_of(model)
    return GENAI_PROVIDERS.get(family, family), model


def model_call(
    model: str,
    *,
    provider: str | None = None,
    max_tokens: Any = None,
    temperature: Any = None,
    conversation_id: str | None = None,
    server: tuple[str, int] | None = None,
) -> Any:
    """A started CLIENT span of one chat call to ``model`` (a litellm model string, or the
    name sent on a direct path with its ``provider``), not made current; ``QUIET`` when off.
    ``replied`` adds the reply's usage, ``end()`` ends it."""
    if tracer() is None:
        return QUIET
    name, sent = genai_provider(model) if provider is None else (provider, model)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": name,
        "gen_ai.system": name,  # the attribute's name before the conventions renamed it
        "gen_ai.request.model": sent,
    }
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if isinstance(temperature, int | float) and not isinstance(temperature, bool):
        attributes["gen_ai.request.temperature"] = float(temperature)
    if conversation_id:
        attributes["gen_ai.conversation.id"] = conversation_id
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    return start(f"chat {sent}", attributes, kind=CLIENT)


def replied(
    call: Any,
    *,
    input_tokens: Any = None,
    output_tokens: Any = None,
    response_model: Any = None,
    response_id: Any = None,
    finish_reasons: list[str] | None = None,
) -> None:
    """The reply's usage and identity on a ``model_call`` span."""
    if call is QUIET or not call.is_recording():
        return
    values: dict[str, Any] = {
        "gen_ai.usage.input_tokens": input_tokens if _count(input_tokens) else None,
        "gen_ai.usage.output_tokens": output_tokens if _count(output_tokens) else None,
        "gen_ai.response.model": response_model if isinstance(response_model, str) else None,
        "gen_ai.response.id": response_id if isinstance(response_id, str) else None,
        "gen_ai.response.finish_reasons": finish_reasons or None,
    }
    call.set_attributes({k: v for k, v in values.items() if v is not None})


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def server_of(url: str | None) -> tuple[str, int] | None:
    """(``server.address``, ``server.port``) of a model's base URL (None without one)."""
    if not url:
        return None
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def assembled_attributes(request: Any) -> dict[str, Any]:
    """What a span says of an assembled request (``AssembledRequest``): its size against its
    budget and window, and what was left out to fit."""
    found = {
        "recap.request.tokens": request.tokens.total,
        "recap.request.budget": request.budget,
        "recap.request.window": request.window,
        "recap.request.messages": len(request.messages),
        "recap.truncated": bool(request.truncated),
        "recap.truncated_tokens": int(request.truncated_tokens),
        "recap.dropped_messages": len(request.dropped_message_ids),
    }
    if request.summary_id is not None:  # the summary the request starts from
        found["recap.summary_id"] = request.summary_id
    return found
