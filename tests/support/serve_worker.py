"""`recap serve` with a Celery worker in the test's process and a summarizer stand-in, on SQLite
or on a PostgreSQL database of the test's own: the stack of the tests that watch a serve turn's
compression run (tests/test_erasure_race_serve.py, tests/test_onprefix_worker.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker

from recap.core.settings import get_settings
from recap.workers.app import app
from tests.support.celery_helpers import configured_app
from tests.support.llm_server import LLMServer
from tests.support.services import postgres_database
from tests.support.serving import Serve, running_serve


@contextlib.contextmanager
def database_url(request: pytest.FixtureRequest, folder: Path) -> Iterator[str]:
    """The database of a fixture parametrized "sqlite" / "postgres": a file in ``folder``, or a
    PostgreSQL database made for it and dropped after."""
    if request.param == "postgres":
        admin = request.getfixturevalue("postgres_admin_url")
        with postgres_database(admin) as url:
            yield url
    else:
        yield f"sqlite:///{folder / 'recap.db'}"


@contextlib.contextmanager
def serve_and_worker(
    url: str, folder: Path, upstream: LLMServer, summarizer: LLMServer, window: int
) -> Iterator[Serve]:
    """Serve on ``url`` against ``upstream``, and a threads worker in this process, both
    summarizing with ``summarizer`` as the chat's model (``openai/stand-in``)."""
    env = {
        "RECAP_DATABASE_URL": url,
        "RECAP_SERVE_MAX_INPUT_TOKENS": str(window),
        "RECAP_BROKER_URL": "filesystem://",
        "RECAP_BROKER_FOLDER": str(folder / "broker"),
        "RECAP_SUMMARY_MODEL": "openai/stand-in",  # the chat's model (tests.support.serving)
        "RECAP_SUMMARY_API_BASE": summarizer.url,
        "RECAP_SUMMARY_API_KEY": "test-key",
        "RECAP_LLM_TIMEOUT": "60",
    }
    with serve_with_worker(url, folder, upstream, env) as serve:
        yield serve


@contextlib.contextmanager
def serve_with_worker(
    url: str, folder: Path, upstream: LLMServer, env: dict[str, str]
) -> Iterator[Serve]:
    """Serve on ``url`` against ``upstream`` and a threads worker in this process, both with
    ``env`` (set in this process for the block, with the settings and the senders' cached apps
    renewed before and after)."""
    from recap.workers import enqueue

    with pytest.MonkeyPatch.context() as monkeypatch:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        get_settings.cache_clear()
        enqueue.reset()
        try:
            with (
                running_serve(url, folder / "serve", upstream, **env) as serve,
                configured_app(get_settings(), None),
                start_worker(app, pool="threads", concurrency=1, perform_ping_check=False,
                             loglevel="WARNING", shutdown_timeout=30),
            ):  # fmt: skip
                yield serve
        finally:
            enqueue.reset()
            get_settings.cache_clear()
