"""Recap's public import package: the host API in one place.

    from recap import Recap, compress_later

    recap = Recap()
    recap.add(conversation_id, {"role": "user", "content": "hi"})
    request = recap.assemble(conversation_id, system="You are ...")
    compress_later(conversation_id)  # after the turn; never waits

Everything Recap installs lives under this package: the library as ``recap.core`` and the
workers, CLI and servers as ``recap.workers`` (in a checkout, ``recap/core`` and
``recap/workers`` link to the top-level ``core/`` and ``workers/`` folders), so a host project
with its own ``core`` or ``workers`` package is never shadowed.

The names below are loaded on first use: ``import recap.workers.app`` (a worker, the CLI) does
not pay for the host API, and ``import recap`` imports neither Celery nor litellm
(``compress_later``, which sends a Celery task, loads Celery the first time it is used). The
framework adapters live in ``recap.integrations`` (the OpenAI Agents SDK, LangChain v1 agents,
Pydantic AI), each behind its optional extra.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recap.core.aio import AsyncRecap
    from recap.core.client import Recap
    from recap.core.errors import (
        BudgetError,
        DatabaseUrlError,
        InputError,
        NotFoundError,
        PinLimitError,
        RecapError,
        SchemaMissingError,
    )
    from recap.core.metrics import enable_metrics
    from recap.core.request.assembly import AssembledRequest, ContextFile, TokenBreakdown
    from recap.core.results import (
        CompressResult,
        ExportedConversation,
        PinResult,
        Stats,
        SummaryInfo,
        UsageRecorded,
    )
    from recap.core.values.request import RequestSpec
    from recap.workers.enqueue import compress_later

# each public name and the module that defines it
_HOMES = {
    "AsyncRecap": "recap.core.aio",
    "Recap": "recap.core.client",
    "BudgetError": "recap.core.errors",
    "DatabaseUrlError": "recap.core.errors",
    "InputError": "recap.core.errors",
    "NotFoundError": "recap.core.errors",
    "PinLimitError": "recap.core.errors",
    "RecapError": "recap.core.errors",
    "SchemaMissingError": "recap.core.errors",
    "AssembledRequest": "recap.core.request.assembly",
    "ContextFile": "recap.core.request.assembly",
    "TokenBreakdown": "recap.core.request.assembly",
    "CompressResult": "recap.core.results",
    "ExportedConversation": "recap.core.results",
    "PinResult": "recap.core.results",
    "Stats": "recap.core.results",
    "SummaryInfo": "recap.core.results",
    "UsageRecorded": "recap.core.results",
    "RequestSpec": "recap.core.values.request",
    "enable_metrics": "recap.core.metrics",
    "compress_later": "recap.workers.enqueue",
}

__all__ = [
    "AssembledRequest",
    "AsyncRecap",
    "BudgetError",
    "CompressResult",
    "ContextFile",
    "DatabaseUrlError",
    "ExportedConversation",
    "InputError",
    "NotFoundError",
    "PinLimitError",
    "PinResult",
    "Recap",
    "RecapError",
    "RequestSpec",
    "SchemaMissingError",
    "Stats",
    "SummaryInfo",
    "TokenBreakdown",
    "UsageRecorded",
    "compress_later",
    "enable_metrics",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its home the first time it is asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'recap' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
