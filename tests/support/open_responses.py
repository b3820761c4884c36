"""The Open Responses specification's own checks, in Python: its schemas (vendored in
``tests/data/open_responses/openapi.json``) validated with ``jsonschema`` (JSON Schema 2020-12,
as OpenAPI 3.1 writes it), its server-sent-event reading, and its compliance templates
(``compliance_templates.json``) run against a server the way its runner runs them: the request
posted, a non-2xx answer a failure, a streamed answer read event by event (every event checked
against the event schemas, the last ``response.completed``, ``.failed`` or ``.incomplete``
taken as the response), the response checked against ``ResponseResource``, then the template's
validators.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator

DATA = Path(__file__).resolve().parents[1] / "data" / "open_responses"
FINAL_EVENTS = ("response.completed", "response.failed", "response.incomplete")
REQUEST_TIMEOUT = 60.0  # seconds for one compliance request


@cache
def document() -> dict[str, Any]:
    """The vendored OpenAPI document."""
    loaded: dict[str, Any] = json.loads((DATA / "openapi.json").read_text())
    return loaded


@cache
def templates() -> list[dict[str, Any]]:
    """The compliance templates."""
    loaded: list[dict[str, Any]] = json.loads((DATA / "compliance_templates.json").read_text())[
        "templates"
    ]
    return loaded


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    # the references are "#/components/schemas/...": the root is the whole document
    return Draft202012Validator({**document(), **schema})


@cache
def component(name: str) -> Draft202012Validator:
    """A validator of one component schema (``ResponseResource``, ``ItemParam``...)."""
    return _validator({"$ref": f"#/components/schemas/{name}"})


@cache
def stream_event() -> Draft202012Validator:
    """A validator of one streamed event: the operation's ``text/event-stream`` schema."""
    answer = document()["paths"]["/responses"]["post"]["responses"]["200"]["content"]
    return _validator(answer["text/event-stream"]["schema"])


def errors(validator: Draft202012Validator, instance: Any) -> list[str]:
    """Every schema error of ``instance``, each as ``path: message``."""
    found = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in found]


def response_errors(response: Any) -> list[str]:
    """The schema errors of a response object, strictly: every error, and any field the
    specification does not name."""
    found = errors(component("ResponseResource"), response)
    if isinstance(response, dict):
        named = set(document()["components"]["schemas"]["ResponseResource"]["properties"])
        found += [f"{key}: not a field of ResponseResource" for key in set(response) - named]
    return found


def event_errors(event: Any) -> list[str]:
    """The schema errors of one streamed event, and of the response it carries, if any."""
    found = errors(stream_event(), event)
    if isinstance(event, dict) and "response" in event:
        found += [f"response.{e}" for e in response_errors(event["response"])]
    return found


@dataclass
class SSE:
    """A stream as the specification's reader reads it."""

    events: list[dict[str, Any]] = field(default_factory=list)  # {"event", "data"}
    errors: list[str] = field(default_factory=list)
    final: Any = None


def read_sse(lines: Iterable[str]) -> SSE:
    """Server-sent events: ``event:`` and ``data:`` lines up to a blank line, ``[DONE]``
    skipped, each event's data checked against the event schemas."""
    out = SSE()
    name, data = "", ""
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
        elif line == "" and data:
            if data != "[DONE]":
                _take(out, name, data)
            name, data = "", ""
    return out


def _take(out: SSE, name: str, data: str) -> None:
    try:
        parsed = json.loads(data)
    except json.JSONDecodeError:
        out.errors.append(f"Failed to parse event data: {data}")
        return
    kind = parsed.get("type") if isinstance(parsed, dict) else None
    out.events.append({"event": name or kind or "unknown", "data": parsed})
    problems = event_errors(parsed)
    if problems:
        out.errors.append(f"Event validation failed for {kind or 'unknown'}: {problems}")
    if kind in FINAL_EVENTS:
        out.final = parsed.get("response")


# --- the templates' validators -------------------------------------------------------------

Check = Callable[[dict[str, Any], SSE | None], list[str]]


def _has_output(response: dict[str, Any], _sse: SSE | None) -> list[str]:
    return [] if response.get("output") else ["Response has no output items"]


def _completed(response: dict[str, Any], _sse: SSE | None) -> list[str]:
    status = response.get("status")
    return [] if status == "completed" else [f'Expected status "completed" but got "{status}"']


def _streaming_events(_response: dict[str, Any], sse: SSE | None) -> list[str]:
    return [] if sse is None or sse.events else ["No streaming events received"]


def _streaming_schema(_response: dict[str, Any], sse: SSE | None) -> list[str]:
    return [] if sse is None else list(sse.errors)


def _function_call_events(_response: dict[str, Any], sse: SSE | None) -> list[str]:
    if sse is None:
        return []
    data = [e["data"] for e in sse.events if isinstance(e["data"], dict)]
    kinds = [d.get("type") for d in data]

    def item_event(kind: str) -> bool:
        return any(
            d.get("type") == kind and (d.get("item") or {}).get("type") == "function_call"
            for d in data
        )

    found = []
    if not item_event("response.output_item.added"):
        found.append("Missing response.output_item.added event with function_call item")
    for kind in ("delta", "done"):
        if f"response.function_call_arguments.{kind}" not in kinds:
            found.append(f"Missing response.function_call_arguments.{kind} event")
    if not item_event("response.output_item.done"):
        found.append("Missing response.output_item.done event with function_call item")
    return found


def _has_output_type(kind: str) -> Check:
    def check(response: dict[str, Any], _sse: SSE | None) -> list[str]:
        if any(item.get("type") == kind for item in response.get("output") or ()):
            return []
        return [f'Expected output item of type "{kind}" but none found']

    return check


CHECKS: dict[str, Check] = {
    "hasOutput": _has_output,
    "completedStatus": _completed,
    "streamingEvents": _streaming_events,
    "streamingSchema": _streaming_schema,
    "functionCallEvents": _function_call_events,
}


def check_of(name: str) -> Check:
    if name.startswith("hasOutputType:"):
        return _has_output_type(name.split(":", 1)[1])
    return CHECKS[name]


# --- running a template --------------------------------------------------------------------


@dataclass
class Result:
    """One template's run: its errors (none when it passed), the response, the stream."""

    errors: list[str]
    response: Any = None
    sse: SSE | None = None


def request_of(template: dict[str, Any], model: str) -> dict[str, Any]:
    """The template's request body for ``model``."""
    body = json.loads(json.dumps(template["request"]))
    body["model"] = model
    return body


def run_template(
    base_url: str, key: str, model: str, template: dict[str, Any], *, streaming: bool
) -> Result:
    """One compliance template against ``base_url`` (ending in ``/v1``), as the
    specification's runner runs it (``streaming`` as the template says, or the other way)."""
    body = {**request_of(template, model), "stream": streaming}
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{base_url}/responses"
    with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
        if not streaming:
            answer = client.post(url, json=body, headers=headers)
            if answer.status_code >= 300:
                return Result([f"HTTP {answer.status_code}: {answer.text}"])
            response, sse = answer.json(), None
        else:
            with client.stream("POST", url, json=body, headers=headers) as answer:
                if answer.status_code >= 300:
                    answer.read()
                    return Result([f"HTTP {answer.status_code}: {answer.text}"])
                sse = read_sse(answer.iter_lines())
            response = sse.final
    found = response_errors(response)
    if found:
        return Result(found, response, sse)
    for name in template["validators"]:
        found += check_of(name)(response, sse)
    return Result(found, response, sse)
