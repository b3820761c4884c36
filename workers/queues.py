"""The task and queue names, in a module of their own: ``recap worker``'s supervisor builds its
children's command lines from them without importing Celery (``workers.app`` re-exports them)."""

from __future__ import annotations

COMPRESS_TASK = "recap.compress_session"  # the task every compression is sent as
RECONCILE_TASK = "recap.reconcile"
COMPRESS_QUEUE = "compress"
MAINTENANCE_QUEUE = "maintenance"
MEMORY_TASK = "recap.extract_memories"  # a user's memory from a turn (docs/memory.md)
MEMORY_QUEUE = "memory"  # its own queue: `recap worker`'s compress worker also consumes it
DEFAULT_QUEUE = "celery"  # Celery's own default: where a plain send_task by name goes

# The header a compression is sent with: when it was sent (time.time()), for the worker's queue
# lag (workers.metrics); here, where neither side needs Celery to read it.
ENQUEUED_HEADER = "recap_enqueued_at"
