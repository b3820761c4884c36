"""What the OpenAI Agents SDK's own session tests need, adapted to ``RecapSession``
(``tests/test_agents_peer_*.py``): a session on a Recap database named by a path or a URL, where
the SDK's tests make a ``SQLiteSession`` or a ``SQLAlchemySession`` on one.

``run_agent_async`` and ``get_text_message`` follow the helpers of the SDK's test suite
(github.com/openai/openai-agents-python, ``tests/memory/test_session.py`` and
``tests/test_responses.py`` at commit 7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7, MIT licence,
Copyright (c) 2025 OpenAI).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from recap.core.client import Recap
from recap.core.settings import Settings
from recap.integrations.openai_agents import RecapSession

MEMORY_URL = "sqlite+aiosqlite:///:memory:"  # the SDK tests' in-memory database: one per test


class Databases:
    """One migrated ``Recap`` per database, for the sessions of one test."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._recaps: dict[str, Recap] = {}
        self._lock = threading.Lock()

    def recap(self, url: str | None = None) -> Recap:
        """The ``Recap`` on ``url`` (an SDK test's SQLite URL or path; None: the test's own)."""
        key = self._url(url)
        with self._lock:
            if key not in self._recaps:
                settings = Settings(database_url=key, output_dir=self.folder / "outputs")
                self._recaps[key] = Recap(settings, create_schema=True)
            return self._recaps[key]

    def _url(self, url: str | None) -> str:
        if url is None or url == MEMORY_URL:
            return f"sqlite:///{self.folder / 'memory.db'}"
        if "://" not in url:  # a path, as SQLiteSession takes it
            return f"sqlite:///{url}"
        return url.replace("+aiosqlite", "")

    def close(self) -> None:
        for recap in self._recaps.values():
            recap.engine.dispose()


CURRENT: list[Databases] = []  # the running test's databases (set by the tests' fixture)


def make_session(
    session_id: str,
    db_path: Path | str | None = None,
    *,
    url: str | None = None,
    engine: str | None = None,
    **options: Any,
) -> RecapSession:
    """A ``RecapSession`` where the SDK's test makes its own session on a path, a URL or an
    engine (here the URL it was made from); compression is left to the test (nothing is
    enqueued)."""
    where = url or engine or (str(db_path) if db_path is not None else None)
    recap = CURRENT[-1].recap(where)
    return RecapSession(session_id, recap=recap, enqueue=False, **options)


def get_text_message(content: str) -> Any:
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    return ResponseOutputMessage(
        id="1",
        type="message",
        role="assistant",
        content=[ResponseOutputText(text=content, type="output_text", annotations=[], logprobs=[])],
        status="completed",
    )


def _run_sync_wrapper(agent: Any, input_data: Any, **kwargs: Any) -> Any:
    from agents import Runner

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, input_data, **kwargs)
    finally:
        loop.close()


async def run_agent_async(runner_method: str, agent: Any, input_data: Any, **kwargs: Any) -> Any:
    """Run the agent with ``Runner.run``, ``run_sync`` (in a thread) or ``run_streamed``."""
    from agents import Runner

    if runner_method == "run":
        return await Runner.run(agent, input_data, **kwargs)
    if runner_method == "run_sync":
        return await asyncio.to_thread(_run_sync_wrapper, agent, input_data, **kwargs)
    if runner_method == "run_streamed":
        result = Runner.run_streamed(agent, input_data, **kwargs)
        async for _event in result.stream_events():
            pass
        return result
    raise ValueError(f"Unknown runner method: {runner_method}")
