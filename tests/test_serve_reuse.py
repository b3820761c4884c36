"""`recap serve` starts each turn from the last one's read (``core.storage.reuse``), and still
sends what the database says: a summary or a clearing written by another process between two
turns is in the next request, which equals a fresh assembly of the same leaf."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from recap.core import service
from recap.core.settings import Settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import MESSAGES, Clearing, Summary, utcnow
from tests.support.llm_server import LLMServer
from tests.test_serve import (
    CALL,
    SYSTEM,
    Serve,
    as_message,
    new_id,
    reply_to,
    running_serve,
    turn,
)

MARK = "SUMMARY-WRITTEN-ELSEWHERE"


@pytest.fixture(scope="module")
def llm() -> Iterator[LLMServer]:
    server = LLMServer(default=reply_to).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(
    llm: LLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Serve, Path]]:
    folder = tmp_path_factory.mktemp("serve-reuse")
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm) as running:
        yield running, folder


def _fresh(serve: Serve, folder: Path, cid: str) -> list[dict[str, Any]]:
    """A fresh assembly (no reuse) of the branch's last user message, as serve assembles it."""
    settings = Settings(reserve_output_tokens=256, output_dir=folder / "outputs")
    m = MESSAGES.c
    with serve.engine.connect() as connection:
        statement = select(m.id).where(m.conversation_id == cid, m.role == "user")
        leaf = max(int(row[0]) for row in connection.execute(statement))
    system = str(SYSTEM["content"])
    request = service.assemble(serve.engine, cid, settings, leaf=leaf, system=system, record=False)
    return request.messages


def _sent(serve: Serve, cid: str, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One stored turn; what serve sent upstream for it."""
    before = len(serve.llm.requests)
    reply = turn(serve, cid, history).parse()
    history.append(as_message(reply))
    return list(serve.llm.requests[before].messages)


def test_turns_see_what_another_process_wrote_between_them(served: tuple[Serve, Path]) -> None:
    serve, folder = served
    cid = new_id()
    history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "list the files"}]
    history.append({"role": "assistant", "content": None, "tool_calls": [CALL]})
    history.append({"role": "tool", "tool_call_id": "call_1", "content": "src/app.py " * 300})
    for n in range(3):
        history.append({"role": "user", "content": f"question {n}"})
        assert _sent(serve, cid, history) == _fresh(serve, folder, cid)

    with session_scope(serve.engine) as session:  # another process's writes: the worker's
        m = MESSAGES.c
        rows = session.connection().execute(
            select(m.id, m.role).where(m.conversation_id == cid).order_by(m.id)
        )
        ids = {role: mid for mid, role in reversed(list(rows))}  # the first of each role
        session.add(
            Clearing(
                conversation_id=cid, message_id=ids["tool"], reason="idle",
                tokens_reclaimed=500, created_at=utcnow(),
            )
        )  # fmt: skip
    history.append({"role": "user", "content": "question 3"})
    sent = _sent(serve, cid, history)
    assert sent == _fresh(serve, folder, cid)
    assert "src/app.py src/app.py src/app.py" not in str(sent)  # the cleared result's placeholder

    with session_scope(serve.engine) as session:
        session.add(
            Summary(
                conversation_id=cid, cutoff_message_id=ids["tool"], text=MARK, tokens=12,
                encoding="o200k_base", model="extractive", created_at=utcnow(),
            )
        )  # fmt: skip
    history.append({"role": "user", "content": "question 4"})
    sent = _sent(serve, cid, history)
    assert sent == _fresh(serve, folder, cid)
    assert MARK in str(sent)
