"""The exceptions a task ends with, so Celery and Flower record FAILURE and RETRY with a reason.

Each carries one argument, the reason already masked by ``core.redact``: with the JSON serializer
Celery stores ``{"exc_type", "exc_message": [reason], "exc_module"}`` and rebuilds the exception
from that list, so JSON is all it needs. They are raised outside any ``except`` block, so
the stored traceback holds no chained exception (a provider's error can quote a key).
"""

from __future__ import annotations


class CompressionFailed(Exception):
    """A ``compress_session`` run ended ``failed``; the message is its masked reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CompressionRetry(Exception):
    """A ``compress_session`` run will be tried again (Celery's RETRY); the masked reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MemoryFailed(Exception):
    """A ``recap.extract_memories`` run failed; the message is its masked reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
