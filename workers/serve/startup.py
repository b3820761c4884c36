"""What ``recap serve`` checks and says when it starts: the database (its schema created when
missing, as ``recap init`` does), one line naming the address, the database, the broker and
whether a worker answers on the compress queue (a warning once when none does, and the answer
as a field of ``/health``), and the upstream's own models for ``GET /v1/models``."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import structlog
from kombu.utils.url import maybe_sanitize_url

from recap.core.settings import Settings
from recap.workers.queues import COMPRESS_QUEUE

log = structlog.get_logger(__name__)

WORKER_TIMEOUT = 1.0  # seconds a worker has to answer the queue inspection (the file broker polls)
WORKER_RECHECK = 30.0  # /health asks the workers again at most this often, in the background
MODELS_TIMEOUT = 5.0  # seconds the upstream has to list its models


def database_url(settings: Settings) -> str:
    """The database URL as it may be shown: without its password."""
    from recap.core.service.database import display_url

    return display_url(settings.database_url)


def prepare_database(settings: Settings) -> str | None:
    """Create the schema when the database has none (``recap init``'s migration); the revision
    it was brought to, or None when it was there already. A database that cannot be reached is
    one ``RecapError`` line."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # no line per plugin or step
    from recap.core.service.database import prepare

    return prepare(settings.database_url)


def compress_workers(timeout: float = WORKER_TIMEOUT) -> list[str]:
    """The workers that answer and consume the compress queue (none: an empty list)."""
    from recap.workers.enqueue import producer_app

    replies = producer_app().control.inspect(timeout=timeout).active_queues() or {}
    return sorted(
        name
        for name, queues in replies.items()
        if any(queue.get("name") == COMPRESS_QUEUE for queue in queues or ())
    )


class WorkerWatch:
    """Whether a worker answers on the compress queue: asked at start-up, again in the
    background when ``/health`` reads it after ``WORKER_RECHECK`` seconds; the warning that
    none does is logged once."""

    def __init__(self) -> None:
        self.answering: bool | None = None  # None: not known (not asked yet, or no broker)
        self.checked = 0.0
        self.warned = False
        self._task: asyncio.Task[bool | None] | None = None

    async def check(self) -> bool | None:
        try:
            workers = await asyncio.to_thread(compress_workers)
        except Exception as exc:  # a broker that does not answer: not known
            log.warning("serve_broker_unreachable", error=type(exc).__name__)
            self.answering = None
        else:
            self.answering = bool(workers)
        self.checked = time.monotonic()
        return self.answering

    def warn_once(self) -> None:
        """The warning that no worker answers, the first time that is so."""
        if self.answering is False and not self.warned:
            self.warned = True
            log.warning(
                "serve_no_worker",
                queue=COMPRESS_QUEUE,
                hint="no worker answers on the compress queue: conversations are stored but not "
                "compressed until one runs (recap worker)",
            )

    async def _recheck(self) -> None:
        await self.check()
        self.warn_once()

    def fields(self) -> dict[str, Any]:
        """``/health``'s field; a recheck started when the answer is old."""
        stale = time.monotonic() - self.checked > WORKER_RECHECK
        if stale and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._recheck())
        return {"compress_worker": self.answering}


async def upstream_models(settings: Settings) -> list[str]:
    """The models the upstream lists at ``RECAP_UPSTREAM_API_BASE/models``, as the model
    strings a client sends (``openai/NAME``); none when it has no base URL or does not say."""
    base = settings.upstream_api_base
    if not base:
        return []
    key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with httpx.AsyncClient(timeout=MODELS_TIMEOUT) as client:
            response = await client.get(base.rstrip("/") + "/models", headers=headers)
        data = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        log.warning("serve_models_unavailable", error=type(exc).__name__)
        return []
    names = [str(m.get("id")) for m in data or () if isinstance(m, dict) and m.get("id")]
    return sorted(name if name.startswith("openai/") else f"openai/{name}" for name in names)


def started_line(address: str, settings: Settings, worker: bool | None) -> None:
    """The one line that says where recap serve listens and what it uses."""
    answer = {True: "answers", False: "none answers", None: "unknown (broker unreachable)"}
    log.info(
        "serve_started",
        listen=address,
        database=database_url(settings),
        broker=maybe_sanitize_url(settings.broker_url),
        compress_worker=answer[worker],
    )
