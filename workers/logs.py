"""Logging: structlog configured once, JSON for workers and readable for the CLI.

Celery's own records go through the same processors, so every line of a task run, Celery's
included, carries ``task_id``, ``task_name`` and ``conversation_id``. Secrets never reach a line:
the values of secret-named keys are masked, and every string goes through ``core.redact`` with
the configured secrets (``register_secrets``).
"""

from __future__ import annotations

import ast
import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog

from recap.core.redact import MASK, MIN_SECRET_CHARS
from recap.core.redact import redact as redact_text
from recap.core.tracing import add_trace_ids

SECRET_KEY = re.compile(r"(api[_-]?key|password|passwd|secret|authorization|token)$", re.I)
_secrets: set[str] = set()


def register_secrets(values: Iterable[str | None]) -> None:
    """Values that must never appear in a log line (API keys, passwords)."""
    _secrets.update(v for v in values if v and len(v) >= MIN_SECRET_CHARS)


def registered_secrets() -> frozenset[str]:
    """The secrets registered so far (the settings' own, see ``core.redact.known_secrets``)."""
    return frozenset(_secrets)


def mask_text(text: str) -> str:
    """The text with registered secrets and key-shaped strings masked."""
    return redact_text(text, _secrets)


def _mask(value: Any) -> Any:
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {k: MASK if SECRET_KEY.search(str(k)) and v else _mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_mask(v) for v in value)
    return value


def redact(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: mask secrets in every value of the event."""
    for key, value in list(event.items()):
        if SECRET_KEY.search(key) and value:
            event[key] = MASK
        else:
            event[key] = _mask(value)
    return event


def _literal(text: Any) -> Any:
    try:
        return ast.literal_eval(text) if isinstance(text, str) else text
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def celery_task_fields(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Celery's own task records (received, succeeded, failed, retry) pass their task as
    ``extra={"data": {...}}``: lift its id, name and conversation into the line."""
    data = event.pop("data", None)
    if not isinstance(data, dict) or "id" not in data:
        return event
    event.setdefault("task_id", data["id"])
    if data.get("name"):
        event.setdefault("task_name", data["name"])
    args, kwargs = _literal(data.get("args")), _literal(data.get("kwargs"))
    conversation = (kwargs or {}).get("conversation_id") if isinstance(kwargs, dict) else None
    if conversation is None and isinstance(args, list | tuple) and args:
        conversation = args[0] if isinstance(args[0], str) else None
    if conversation is not None:
        event.setdefault("conversation_id", conversation)
    return event


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
        celery_task_fields,
        add_trace_ids,  # the current span's trace_id and span_id, when one is
        structlog.processors.format_exc_info,
        redact,
    ]


_configured: str | None = None
# kombu warns on every connection to a URL without a host, which the file broker never has.
NOISE = ("No hostname was supplied",)


def _drop_noise(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith(NOISE))


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record, so a process that swaps
    its stderr (a test runner, a CLI runner, a daemon redirecting it) never writes to a closed
    stream that was current when logging was configured."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # set by StreamHandler.__init__; the property wins
        pass


def configure_logging(*, json_output: bool, level: str | int = "INFO", force: bool = False) -> None:
    """Configure structlog and the standard library once (again only with ``force``)."""
    global _configured
    mode = "json" if json_output else "console"
    if _configured == mode and not force:
        logging.getLogger().setLevel(level.upper() if isinstance(level, str) else level)
        return
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*_shared_processors(), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    handler.addFilter(_drop_noise)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared_processors(),
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    logging.captureWarnings(True)  # warnings become log lines too, JSON like the rest
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)  # Celery passes an int
    _configured = mode
