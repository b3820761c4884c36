"""Recap's public import package: the host API in one place.

    from recap import Recap, compress_later

    recap = Recap()
    recap.add(conversation_id, {"role": "user", "content": "hi"})
    request = recap.assemble(conversation_id, system="You are ...")
    compress_later(conversation_id)  # after the turn; never waits

``import recap`` imports neither Celery nor litellm: ``compress_later`` (which sends a Celery
task) is loaded the first time it is used. The framework adapters live in
``recap.integrations`` (the OpenAI Agents SDK, LangChain v1 agents, Pydantic AI), each behind
its optional extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from recap.workers.enqueue import compress_later

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
]


def __getattr__(name: str) -> Any:
    """``compress_later`` on first use: it imports Celery, which a host that only assembles
    never needs."""
    if name == "compress_later":
        from recap.workers.enqueue import compress_later

        globals()["compress_later"] = compress_later
        return compress_later
    raise AttributeError(f"module 'recap' has no attribute {name!r}")
