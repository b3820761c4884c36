"""Creating a conversation from `recap serve` is idempotent across processes: insert-or-get
under the primary key, so concurrent first turns never see "already exists".

The interleaving that broke it (two transactions find no row, one creates and commits it, the
other then creates it too) is replayed step by step on two sessions; then two sessions race for
real on PostgreSQL, one insert waiting on the other's uncommitted row.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update
from sqlmodel import Session

from recap.core.errors import InputError, NotFoundError
from recap.core.settings import get_settings
from recap.core.storage import requests as history
from recap.core.storage import store
from recap.core.storage.models import CONVERSATIONS, utcnow
from recap.core.storage.outputs import Ingest
from tests.support.data import migrated

MODEL = "gpt-4o-mini"


def _touch(session: Session, cid: str) -> int:
    """The first step of a serve write: lock the conversation by updating it (0 rows: new)."""
    result: Any = session.execute(
        update(CONVERSATIONS).where(CONVERSATIONS.c.id == cid).values(last_activity_at=utcnow())
    )
    return int(result.rowcount)


def _count(engine: Engine, cid: str) -> int:
    with engine.connect() as connection:
        statement = select(func.count()).where(CONVERSATIONS.c.id == cid)
        return int(connection.execute(statement).scalar_one())


def test_two_sessions_creating_one_conversation_interleaved(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both find no row; the first creates and commits it; the second, which the old
    create-or-fail call refused ("already exists"), gets the same row, not created by it."""
    engine = migrated(db_url, monkeypatch)
    first, second = Session(engine), Session(engine)
    try:
        assert _touch(first, "c1") == 0
        if engine.dialect.name == "postgresql":  # SQLite lets one writer in at a time
            assert _touch(second, "c1") == 0
        conversation, created = store.ensure_conversation(first, "c1", MODEL, owner="a")
        assert created and conversation.owner == "a"
        first.commit()
        with pytest.raises(InputError, match="already exists"):  # the old path
            store.create_conversation(second, "c1", MODEL)
        again, created = store.ensure_conversation(second, "c1", MODEL, owner="b")
        assert not created and again.owner == "a"
        second.commit()
    finally:
        first.close()
        second.close()
    assert _count(engine, "c1") == 1


def test_an_insert_waits_for_the_others_uncommitted_row(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the second insert meets the first's uncommitted row, waits for its commit,
    then does nothing; neither sees an error."""
    engine = migrated(postgres_url, monkeypatch)
    first = Session(engine)
    outcome: list[Any] = []
    store.ensure_conversation(first, "c2", MODEL, owner="a")  # inserted, not committed

    def second() -> None:
        with Session(engine) as session:
            try:
                outcome.append(store.ensure_conversation(session, "c2", MODEL, owner="b")[1])
                session.commit()
            except Exception as exc:  # reported below
                outcome.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(timeout=0.5)
    assert thread.is_alive(), "the second insert did not wait for the first's row"
    first.commit()
    first.close()
    thread.join()
    assert outcome == [False]
    assert _count(engine, "c2") == 1


def test_serve_claims_are_idempotent_and_owned(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serve write path: a new id is created for its key, the same id again is the same
    conversation, another key's is hidden as if it did not exist."""
    engine = migrated(db_url, monkeypatch)
    ingest = Ingest.from_settings(get_settings())
    owner = history.Owner("key-a", MODEL, None)
    messages = [{"role": "user", "content": "hi"}]
    first = history.store_request(engine, ingest, "c3", owner, messages)
    again = history.store_request(engine, ingest, "c3", owner, messages)
    assert again.path == first.path and again.appended == []
    with pytest.raises(NotFoundError):
        history.store_request(engine, ingest, "c3", history.Owner("key-b", MODEL, None), messages)
    assert _count(engine, "c3") == 1
