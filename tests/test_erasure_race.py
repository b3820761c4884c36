"""Erased means gone: a compression run in flight when its conversation is deleted and created
again under the same id writes nothing into the new one, and ids of erased rows are never handed
out again (SQLite and PostgreSQL).

The run's summarizer is the stand-in model server (``tests.support.llm_server``) holding its
answer until the delete and the new import are done: through the CLI (``recap compress --force``
in a child process) and through a real Celery worker (``recap.compress_session``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from recap.core import service
from recap.core.settings import get_settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import CLEARINGS, MESSAGES, SUMMARIES, CompactionLog, table_of
from recap.workers.app import app
from tests.support.cli_helpers import recap
from tests.support.llm_server import LLMServer, Reply
from tests.test_compress_worker import chat, harness_for

WINDOW = 3_000  # a dozen turns go over the trigger (tests.test_compress_worker)
OLD, NEW = "old", "new"  # the tags of the erased chat's and the new chat's texts
RUN_TIMEOUT = 120
LOG = table_of(CompactionLog)


def import_chat(tmp: Path, cid: str, tag: str) -> None:
    """``recap import`` of a twelve-turn chat whose texts carry ``tag``."""
    path = tmp / f"{cid}-{tag}.jsonl"
    path.write_text(json.dumps({"id": cid, "messages": chat(12, tag)}) + "\n")
    done = recap("import", str(path), "--max-input-tokens", str(WINDOW), "--json")
    assert done.code == 0, done.stderr


def rows_of(engine: Engine, cid: str) -> dict[str, int]:
    """The conversation's summaries, clearings and log rows."""
    with session_scope(engine) as session:
        connection = session.connection()
        return {
            table.name: int(
                connection.execute(
                    select(func.count()).where(table.c.conversation_id == cid)
                ).scalar()
                or 0
            )
            for table in (SUMMARIES, CLEARINGS, LOG)
        }


def assert_nothing_of_the_erased_chat(engine: Engine, cid: str) -> None:
    """The new conversation holds no summary, clearing or log row, and its request none of the
    erased chat's text or paths."""
    assert rows_of(engine, cid) == {"summaries": 0, "clearings": 0, "compaction_log": 0}
    request = recap("assemble", cid, "--json")
    assert request.code == 0, request.stderr
    text = request.stdout
    assert f"{OLD}.py" not in text and f"{OLD}word" not in text
    assert f"module_11{NEW}.py" in text
    assert request.json()["summary_id"] is None


def assert_skipped_for_recreation(done: dict[str, Any]) -> None:
    assert done["action"] == "skipped", done
    assert "deleted" in done["reason"] and "created again" in done["reason"], done
    assert done["summary_id"] is None and done["cutoff_message_id"] is None, done


def test_cli_run_outlived_by_delete_and_recreate_writes_nothing(
    engine: Engine, tmp_path: Path
) -> None:
    """``recap compress victim --force`` waiting on its summarizer while ``recap delete victim
    --yes`` and a new ``victim`` is imported: the run ends skipped, naming the re-creation, and
    the new conversation carries nothing of the erased one."""
    server = LLMServer().start()
    server.script(Reply(hold=True))
    env = {
        **os.environ,
        "RECAP_SUMMARY_MODEL": "openai/stand-in",
        "RECAP_SUMMARY_API_BASE": server.url,
        "RECAP_SUMMARY_API_KEY": "test-key",
        "RECAP_LLM_TIMEOUT": "60",
    }
    try:
        import_chat(tmp_path, "victim", OLD)
        run = subprocess.Popen(
            [sys.executable, "-m", "recap.workers.cli", "compress", "victim", "--force", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert server.wait_for(1, timeout=RUN_TIMEOUT), "the run never called the model"
            assert f"module_0{OLD}.py" in server.requests[0].text
            assert recap("delete", "victim", "--yes").code == 0
            import_chat(tmp_path, "victim", NEW)
        finally:
            server.release()
            out, err = run.communicate(timeout=RUN_TIMEOUT)
        assert run.returncode == 0, err
        assert_skipped_for_recreation(json.loads(out))
    finally:
        server.stop()
    assert_nothing_of_the_erased_chat(engine, "victim")


@pytest.mark.redis
def test_worker_run_outlived_by_delete_and_recreate_writes_nothing(
    db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same race with the run on a real worker (``recap.compress_session``), the delete and
    the new import through the CLI: the task ends skipped, and a run of the new conversation
    afterwards summarizes the new chat alone."""
    with harness_for(db_url, redis_url, monkeypatch) as h:
        import_chat(tmp_path, "victim", OLD)
        h.server.script(Reply(hold=True))
        sent = app.send_task("recap.compress_session", args=["victim"], kwargs={"force": True})
        assert h.server.wait_for(1), "the run never called the model"
        assert recap("delete", "victim", "--yes").code == 0
        import_chat(tmp_path, "victim", NEW)
        h.server.release()
        done = sent.get(timeout=RUN_TIMEOUT)
        assert_skipped_for_recreation(done)
        assert_nothing_of_the_erased_chat(h.engine, "victim")

        again = h.compress("victim", force=True)
        assert again["action"] == "summarized", again
        summary = service.list_summaries(h.engine, "victim")
        assert len(summary) == 1
        newest = h.server.requests[-1].text
        assert f"module_0{NEW}.py" in newest and f"module_0{OLD}.py" not in newest


def test_erased_ids_are_never_handed_out_again(engine: Engine, tmp_path: Path) -> None:
    """Deleting the conversation that holds the newest messages, summaries and log rows, then
    storing more: every new id is above every erased one, in every table that keeps ids."""
    get_settings.cache_clear()
    import_chat(tmp_path, "first", OLD)
    assert recap("compress", "first", "--force", "--json").json()["action"] == "summarized"
    with session_scope(engine) as session:
        connection = session.connection()
        erased = {
            table.name: int(connection.execute(select(func.max(table.c.id))).scalar() or 0)
            for table in (MESSAGES, SUMMARIES, LOG)
        }
    assert recap("delete", "first", "--yes").code == 0
    import_chat(tmp_path, "first", NEW)
    assert recap("compress", "first", "--force", "--json").json()["action"] == "summarized"
    with session_scope(engine) as session:
        connection = session.connection()
        for table in (MESSAGES, SUMMARIES, LOG):
            lowest = connection.execute(select(func.min(table.c.id))).scalar()
            assert lowest is not None and int(lowest) > erased[table.name], table.name
