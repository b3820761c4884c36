"""Erased means gone through `recap serve`, across keys: key B's conversation deleted while its
compression run waits on the summarizer, then its name opened again (by key A, or by B itself)
before the run ends. The run writes nothing into the new conversation, and its next upstream
request carries none of the erased messages and no summary of them.

A real serve process (two client keys), a real Celery worker in this process on the embedded
file broker, the stand-in upstream, and a second stand-in as the summarizer holding its answer
until the delete and the new first turn are done, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from recap.core.storage.models import SUMMARIES
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from tests.support.cli_helpers import recap
from tests.support.llm_server import LLMServer, Reply
from tests.support.serve_worker import database_url, serve_and_worker
from tests.support.serving import (
    KEY_A,
    KEY_B,
    SYSTEM,
    Serve,
    as_message,
    reply_to,
    runs,
    turn,
    wait_until,
)

WINDOW = 3_000  # six turns of 120 words go over the trigger
TURNS = 6  # B's turns: enough for a run to summarize
WORDS = 120  # words of each of B's turns
SECRET = "bsecret"  # in every text of B's erased chat (and its paths)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Serve, LLMServer]]:
    """Serve with keys A and B, its worker, and the summarizer (not holding yet)."""
    tmp_path = tmp_path_factory.mktemp("erasure-serve")
    upstream = LLMServer(default=reply_to).start()
    summarizer = LLMServer().start()
    try:
        with (
            database_url(request, tmp_path) as url,
            serve_and_worker(url, tmp_path, upstream, summarizer, WINDOW) as serve,
        ):
            yield serve, summarizer
    finally:
        summarizer.release()
        summarizer.stop()
        upstream.stop()


def b_turns(serve: Serve, cid: str) -> list[dict[str, Any]]:
    """B's chat on ``cid``, each turn naming a private path of B's."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for n in range(TURNS):
        words = " ".join(f"{SECRET}{n}w{i}" for i in range(WORDS))
        messages.append({"role": "user", "content": f"see /home/{SECRET}/plan_{n}.py: {words}"})
        messages.append(as_message(turn(serve, cid, messages, key=KEY_B).parse()))
    return messages


def summaries_of(serve: Serve, cid: str) -> int:
    with serve.engine.connect() as connection:
        statement = select(func.count()).where(SUMMARIES.c.conversation_id == cid)
        return int(connection.execute(statement).scalar_one())


@pytest.mark.parametrize("opener", ["A", "B"])
def test_a_run_outlived_by_delete_and_reopen_through_serve(
    stack: tuple[Serve, LLMServer], opener: str
) -> None:
    """B's conversation is deleted while its run waits on the summarizer; ``opener`` (key A, or
    B again) opens the same name before the run ends. The run stores no summary for the new
    conversation, and the new conversation's next upstream request carries none of B's erased
    messages and no summary."""
    serve, summarizer = stack
    key = KEY_A if opener == "A" else KEY_B
    cid = f"victim-{opener}"
    summarizer.hold_again()
    summarizer.script(Reply(hold=True))
    called = len(summarizer.requests)
    b_turns(serve, cid)
    assert summarizer.wait_for(called + 1, timeout=120), "no run called the summarizer"
    assert SECRET in summarizer.requests[called].text  # the run in flight read B's chat
    assert recap("delete", cid, "--yes").code == 0  # the operator erases B's conversation

    first = [SYSTEM, {"role": "user", "content": f"hello from {opener}, first turn"}]
    reply = turn(serve, cid, first, key=key)
    assert reply.http_response.status_code == 200
    assert SECRET not in serve.llm.requests[-1].text
    stored = serve.branch(cid)
    assert [m["role"] for m in stored] == ["user", "assistant"]  # the new conversation alone

    summarizer.release()  # the stale run ends now; then the runs the turns queued behind it
    wait_until(lambda: runs(serve, cid) >= 1, what="a run of the new conversation after it")
    assert summaries_of(serve, cid) == 0

    follow = [*first, as_message(reply.parse()), {"role": "user", "content": "second turn"}]
    turn(serve, cid, follow, key=key)
    sent = serve.llm.requests[-1].text
    assert SECRET not in sent
    assert SUMMARY_MESSAGE_PREFIX.strip()[:20] not in sent
    assert summaries_of(serve, cid) == 0
    branch = serve.branch(cid)
    assert all(SECRET not in str(m.get("content")) for m in branch)
    assert len(branch) == 4
