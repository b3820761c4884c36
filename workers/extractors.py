"""The extractors a memory run calls, with no session held (``core.memory.run``): the memory
model through litellm (``RECAP_MEMORY_MODEL``, else the summary model), offered the
``set_memory`` and ``delete_memory`` tools, whose calls are the edits; else the offline rules.
This module imports no Celery: ``Recap.extract_memories`` reaches it through the
``recap.engine`` entry point ``extractors``.
"""

from __future__ import annotations

import json
from typing import Any

from recap.core.memory.extractor import (
    TOOLS,
    Extraction,
    ExtractionFailed,
    Extractor,
    OfflineExtractor,
    RetryLater,
    edits_from_calls,
    prompt,
)
from recap.core.memory.window import Window
from recap.core.settings import Settings
from recap.core.values.memory import MemoryRec

EXTRACTION_MAX_TOKENS = 1_000  # the tool calls of one extraction: a few short facts


def extractor_for(settings: Settings, attempt: int) -> Extractor:
    """The ``recap.engine`` entry point ``extractors``: the memory model's extractor for this
    attempt, else the offline one."""
    if settings.memory_model or settings.summary_model:
        return ModelExtractor(settings, attempt)
    return OfflineExtractor()


class ModelExtractor:
    """One call of the memory model with the ``set_memory`` and ``delete_memory`` tools; the
    edits are the tool calls it makes (applied by the run after the call, in one write)."""

    def __init__(self, settings: Settings, attempt: int) -> None:
        self.settings = settings
        self.attempt = attempt
        self.model = settings.memory_model or settings.summary_model or ""

    def extract(self, window: Window, existing: list[MemoryRec] | Any) -> Extraction:
        import litellm

        from recap.workers import llm

        settings = self.settings
        key = settings.summary_api_key.get_secret_value() if settings.summary_api_key else None
        try:
            response = litellm.completion(
                model=self.model,
                messages=[{"role": "user", "content": prompt(window, existing)}],
                tools=TOOLS,
                timeout=settings.llm_timeout,
                max_retries=0,
                num_retries=0,
                api_base=settings.summary_api_base,
                api_key=key,
                max_tokens=EXTRACTION_MAX_TOKENS,
                temperature=0,
            )
        except Exception as exc:  # sorted as the summarizer's are
            error = llm.classify(exc)
            if error.retryable and self.attempt + 1 < settings.max_attempts:
                delay = llm.backoff_seconds(self.attempt, settings.retry_backoff_max)
                raise RetryLater(str(error), delay) from None
            raise ExtractionFailed(f"the memory model failed: {error}") from None
        choice = response.choices[0] if getattr(response, "choices", None) else None
        message = getattr(choice, "message", None)
        calls = [_call(c) for c in (getattr(message, "tool_calls", None) or [])]
        edits, refused = edits_from_calls(calls)
        usage = getattr(response, "usage", None)
        hidden = getattr(response, "_hidden_params", None) or {}
        return Extraction(
            edits=edits,
            refused=refused,
            model=self.model,
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            cost=float(hidden.get("response_cost") or 0.0),
            calls=1,
        )


def _call(call: Any) -> dict[str, Any]:
    """A tool call of litellm's reply as a plain dict."""
    function = getattr(call, "function", None)
    arguments = getattr(function, "arguments", None)
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments or {})
    return {"function": {"name": getattr(function, "name", None), "arguments": arguments}}
