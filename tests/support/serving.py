"""A `recap serve` of a test module, on the stand-in model (``tests.support.llm_server``): the
``Serve`` handle a test reads back through, ``running_serve`` to start one, one chat turn
(``turn``), and the fixtures the serve test modules share (registered in conftest): ``llm``, the
stand-in model of a module; ``serve_litellm``, a second serve on the litellm path; ``either``,
both paths over the module's own ``serve`` fixture.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import Engine, func, select

from recap.core import service
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import MESSAGES, CompactionLog, Usage, table_of
from tests.support.llm_server import LLMServer
from tests.support.processes import wait_for
from tests.support.serve_stack import serve_env, serve_process

KEY_A, KEY_B = "client-key-aaaa-1111", "client-key-bbbb-2222"
UPSTREAM_KEY = "sk-upstream-secret-0123456789abcdef"
MODEL = "openai/stand-in"
WAIT_TIMEOUT = 60.0  # seconds any other condition may take
BODY_LIMIT = 200_000  # small, so the oversized-body test sends little
WINDOW = 8_000  # the window serve gives the stand-in model
USAGE = table_of(Usage)


def wait_until(condition: Any, what: str) -> None:
    wait_for(condition, WAIT_TIMEOUT, what)


def reply_to(body: dict[str, Any]) -> str:
    """The stand-in model's answer: it names the last user message, so each is distinct."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    last = str(users[-1].get("content")) if users else ""
    return f"reply to: {last[:80]} | with extra words for a few stream chunks"


@dataclass
class Serve:
    """A running `recap serve` and what a test reads back."""

    base_url: str
    engine: Engine
    llm: LLMServer
    log: Path
    path: str = "direct"

    def client(self, key: str = KEY_A) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=60)

    def branch(self, cid: str) -> list[dict[str, Any]]:
        return list(service.export_conversation(self.engine, cid)["messages"])

    def count(self, cid: str) -> int:
        with self.engine.connect() as connection:
            statement = select(func.count()).where(MESSAGES.c.conversation_id == cid)
            return int(connection.execute(statement).scalar_one())

    def rows(self, cid: str) -> list[tuple[Any, ...]]:
        m = MESSAGES.c
        with self.engine.connect() as connection:
            statement = (
                select(m.id, m.parent_id, m.role, m.content)
                .where(m.conversation_id == cid)
                .order_by(m.id)
            )
            return [tuple(row) for row in connection.execute(statement)]

    def usage(self, cid: str) -> list[tuple[int, int]]:
        with self.engine.connect() as connection:
            statement = select(USAGE.c.prompt_tokens, USAGE.c.completion_tokens).where(
                USAGE.c.conversation_id == cid
            )
            return [(int(a), int(b)) for a, b in connection.execute(statement)]


@contextmanager
def running_serve(db_url: str, folder: Path, llm: LLMServer, **env: str) -> Iterator[Serve]:
    """`recap serve` on a free port against ``db_url`` and ``llm``, stopped afterwards."""
    engine = make_engine(db_url)
    upgrade(engine)
    values = serve_env(
        db_url,
        folder,
        keys=f"{KEY_A},{KEY_B}",
        upstream=llm.url,
        upstream_key=UPSTREAM_KEY,
        window=WINDOW,
        RECAP_SERVE_MAX_BODY_BYTES=str(BODY_LIMIT),
        **env,
    )
    try:
        with serve_process(values, folder) as process:
            yield Serve(process.base_url, engine, llm, process.log)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def llm() -> Iterator[LLMServer]:
    """The stand-in model of a module's serve tests, answering each request with ``reply_to``."""
    server = LLMServer(default=reply_to).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def serve_litellm(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """A second serve process that sends every request through litellm."""
    folder = tmp_path_factory.mktemp("serve-litellm")
    db_url = f"sqlite:///{folder / 'recap.db'}"
    with running_serve(db_url, folder, llm, RECAP_UPSTREAM_CLIENT="litellm") as running:
        running.path = "litellm"
        yield running


@pytest.fixture(params=["direct", "litellm"])
def either(request: pytest.FixtureRequest) -> Serve:
    """Both upstream paths, on the module's ``serve``: the default (direct, for an `openai/` model
    with a base URL) and litellm, whose chunks and replies are converted as well as the direct
    path's JSON; the upstream's User-Agent tells which one sent a request."""
    name = "serve" if request.param == "direct" else "serve_litellm"
    running: Serve = request.getfixturevalue(name)
    return running


def new_id() -> str:
    return f"conv-{uuid.uuid4().hex[:10]}"


def turn(
    serve: Serve, cid: str | None, messages: list[dict[str, Any]], key: str = KEY_A, **kwargs: Any
) -> Any:
    headers = {"X-Recap-Conversation": cid} if cid is not None else {}
    create: Any = serve.client(key).chat.completions.with_raw_response.create  # any SDK version
    return create(model=MODEL, messages=messages, extra_headers=headers, **kwargs)


def as_message(reply: Any) -> dict[str, Any]:
    """A reply message as the openai SDK user appends it to the history."""
    return dict(reply.choices[0].message.model_dump(exclude_none=True))


SYSTEM = {"role": "system", "content": "You are a careful assistant."}


def runs(serve: Serve, cid: str) -> int:
    """compress_session runs the worker has logged for the conversation (consecutive skips
    share a row, counted by its ``repeats``)."""
    log = table_of(CompactionLog)
    with serve.engine.connect() as connection:
        total = func.coalesce(func.sum(log.c.repeats), 0)
        statement = select(total).where(log.c.conversation_id == cid)
        return int(connection.execute(statement).scalar_one())
