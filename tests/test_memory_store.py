"""A user's memory in the store (the writes that race on both SQLite and PostgreSQL): entries
within the cap, the user's switch on both sides, one write per turn however often it is
delivered, erasure with the source conversation (delete and retention), failures logged apart
from compression's, one user (and one serve key) never reaching another's entries, and the CLI's
one-line refusals that change nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from recap.core.client import Recap
from recap.core.errors import InputError
from recap.core.memory import run as memory_run
from recap.core.memory.extractor import Extraction, ExtractionFailed, OfflineExtractor
from recap.core.memory.window import Window
from recap.core.settings import Settings, load_settings
from recap.core.storage import erase, memories
from recap.core.storage.models import CompactionLog, table_of, utcnow
from recap.core.values.memory import MemoryEdit, MemoryRec, serve_user
from tests.support.cli_helpers import FAILED, assert_refused, recap, snapshot

LOG = table_of(CompactionLog)


def settings_for(engine: Engine, **more: Any) -> Settings:
    url = engine.url.render_as_string(hide_password=False)
    return load_settings(**{"database_url": url, "memory": "on", **more})


class Counting:
    """An extractor that counts its calls and answers with given edits."""

    def __init__(self, edits: Sequence[MemoryEdit] = (), fail: str | None = None) -> None:
        self.calls = 0
        self.edits = list(edits)
        self.fail = fail

    def __call__(self, settings: Settings, attempt: int) -> Counting:
        return self

    def extract(self, window: Window, existing: Sequence[MemoryRec]) -> Extraction:
        self.calls += 1
        if self.fail:
            raise ExtractionFailed(self.fail)
        return Extraction(edits=list(self.edits), model="counting")


def chat(r: Recap, text: str) -> str:
    cid = r.new(model="gpt-4o-mini")
    r.add(cid, {"role": "user", "content": text})
    r.add(cid, {"role": "assistant", "content": "noted"})
    return cid


def extract(r: Recap, user: str, cid: str, extractors: Any = memory_run.offline) -> dict[str, Any]:
    return memory_run.extract_memories(r.engine, r.settings, user, cid, extractors=extractors)


def log_actions(engine: Engine, cid: str) -> list[str]:
    with engine.connect() as connection:
        rows = connection.execute(select(LOG.c.action).where(LOG.c.conversation_id == cid))
        return [row[0] for row in rows]


def test_extraction_writes_once_per_turn_and_is_logged(engine: Engine) -> None:
    r = Recap(settings_for(engine), engine)
    cid = chat(r, "my name is Amy and I use metric units")
    first = extract(r, "amy", cid)
    assert first["action"] == "extracted"
    again = extract(r, "amy", cid)  # a redelivered task
    assert again["action"] == "skipped" and "already" in again["reason"]
    # two writers of the same turn that both read before either wrote: one writes
    write = memories.ExtractionWrite(
        user_id="amy",
        conversation=erase.store.Identity(cid),
        message_id=first["message_id"],
        edits=[MemoryEdit("set", "extra", "x")],
        cap=2_000,
    )
    assert memories.write_extraction(engine, write).done is not None
    stored = {m.key: m for m in r.memories("amy")}
    assert set(stored) == {"name", "uses.metric-units"}
    assert all(m.uses == 1 and m.conversation_id == cid for m in stored.values())
    assert log_actions(engine, cid) == [memory_run.EXTRACTED]


def test_the_cap_refuses_a_set_and_changes_nothing(engine: Engine) -> None:
    r = Recap(settings_for(engine, memory_max_tokens=30), engine)
    r.set_memory("amy", "units", "metric units")
    before = r.memories("amy")
    with pytest.raises(InputError, match="cap of 30 tokens"):
        r.set_memory("amy", "long", "word " * 40)
    assert r.memories("amy") == before
    r.set_memory("amy", "units", "imperial units")  # replacing an entry counts it once
    assert [m.text for m in r.memories("amy")] == ["imperial units"]
    assert r.memories("amy")[0].uses == 2


def test_the_model_past_the_cap_is_refused_edit_by_edit(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    r = Recap(settings_for(engine, memory_max_tokens=25), engine)
    cid = chat(r, "hello")
    edits = [MemoryEdit("set", "a", "short fact"), MemoryEdit("set", "b", "word " * 30)]
    result = extract(r, "amy", cid, Counting(edits))
    assert [e["key"] for e in result["applied"]] == ["a"]
    assert len(result["refused"]) == 1 and "cap" in result["refused"][0]


def test_the_users_switch_off_means_no_call_and_no_injection(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    r = Recap(settings_for(engine), engine)
    r.set_memory("amy", "units", "The user uses metric units.")
    r.set_memory_enabled("amy", False)
    cid = chat(r, "my name is Amy")
    counting = Counting([MemoryEdit("set", "name", "Amy")])
    assert extract(r, "amy", cid, counting)["action"] == "skipped"
    assert counting.calls == 0
    assert r.assemble(cid, user_id="amy").tokens.memory == 0
    r.set_memory_enabled("amy", True)
    assert r.assemble(cid, user_id="amy").tokens.memory > 0
    assert extract(r, "amy", cid, counting)["action"] == "extracted" and counting.calls == 1


def test_memory_off_or_read_extracts_nothing(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    for mode in ("off", "read"):
        r = Recap(settings_for(engine, memory=mode), engine)
        cid = chat(r, "my name is Amy")
        counting = Counting([MemoryEdit("set", "name", "Amy")])
        assert extract(r, "amy", cid, counting)["action"] == "skipped"
        assert counting.calls == 0 and r.memories("amy") == []
    r = Recap(settings_for(engine, memory="off"), engine)
    r.set_memory("amy", "units", "metric")
    assert r.assemble(cid, user_id="amy").tokens.memory == 0  # off: not sent either
    r = Recap(settings_for(engine, memory="read"), engine)
    assert r.assemble(cid, user_id="amy").tokens.memory > 0


def test_erasing_the_source_conversation_erases_what_it_wrote(engine: Engine) -> None:
    r = Recap(settings_for(engine), engine)
    source = chat(r, "my name is Amy")
    other = chat(r, "I live in Leadworth")
    extract(r, "amy", source)
    extract(r, "amy", other)
    r.set_memory("amy", "units", "metric")  # by hand: no source
    r.delete(source)
    assert {m.key for m in r.memories("amy")} == {"home", "units"}
    # retention: an idle conversation goes with what it wrote
    later = utcnow() + timedelta(days=1)
    erase.expire_idle(engine, r.settings.output_dir, idle_before=later, limit=10)
    assert {m.key for m in r.memories("amy")} == {"units"}
    assert memories.written_by(engine, "amy") == []


def test_a_failed_extraction_is_logged_apart_and_writes_nothing(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    r = Recap(settings_for(engine), engine)
    cid = chat(r, "my name is Amy")
    with pytest.raises(memory_run.Failed, match="bad answer"):
        extract(r, "amy", cid, Counting(fail="bad answer"))
    assert log_actions(engine, cid) == [memory_run.FAILED]
    assert r.memories("amy") == []
    assert extract(r, "amy", cid)["action"] == "extracted"  # a later run of the turn may write


def test_an_extraction_of_a_deleted_conversation_writes_nothing(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    r = Recap(settings_for(engine), engine)
    cid = chat(r, "my name is Amy")

    class DeletingMidCall(Counting):
        def extract(self, window: Window, existing: Sequence[MemoryRec]) -> Extraction:
            r.delete(cid)  # erased while the model answers
            return OfflineExtractor().extract(window, existing)

    assert extract(r, "amy", cid, DeletingMidCall())["action"] == "skipped"
    assert r.memories("amy") == []


def test_one_user_never_sees_anothers_memory(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    r = Recap(settings_for(engine), engine)
    amy = chat(r, "my name is Amy")
    extract(r, "amy", amy)
    bob = chat(r, "what is my name?")
    assert r.memories("bob") == [] and r.export_memories("bob")["memories"] == []
    request = r.assemble(bob, user_id="bob")
    assert request.tokens.memory == 0 and "Amy" not in json.dumps(request.messages)
    assert "Amy" in json.dumps(r.assemble(bob, user_id="amy").messages)
    # Bob's extraction of Amy's conversation writes to Bob, never to Amy
    extract(r, "bob", amy)
    assert {m.key for m in r.memories("amy")} == {"name"}
    r.delete_memory("bob")
    assert r.memories("bob") == [] and len(r.memories("amy")) == 1


def test_serve_users_are_scoped_by_the_key() -> None:
    a = serve_user("f" * 32, "amy")
    b = serve_user("e" * 32, "amy")
    assert a != b and a.endswith("/amy") and b.endswith("/amy")
    with pytest.raises(InputError):
        serve_user("f" * 32, "x" * 300)


def test_export_holds_everything_kept(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    r = Recap(settings_for(engine), engine)
    cid = chat(r, "my name is Amy")
    extract(r, "amy", cid)
    r.set_memory_enabled("amy", False)
    exported = r.export_memories("amy")
    assert exported["enabled"] is False
    assert [m["key"] for m in exported["memories"]] == ["name"]
    assert exported["extractions"][0]["conversation_id"] == cid
    json.dumps(exported)


# --- the CLI ---------------------------------------------------------------------------------


def test_the_cli_lists_sets_deletes_and_exports(sqlite_engine: Engine) -> None:
    assert recap("memory", "set", "amy", "units", "metric", "--json").json()["key"] == "units"
    listed = recap("memory", "list", "amy", "--json").json()
    assert [m["key"] for m in listed["memories"]] == ["units"] and listed["enabled"] is True
    assert recap("memory", "off", "amy", "--json").json() == {"user_id": "amy", "enabled": False}
    assert json.loads(recap("memory", "export", "amy").stdout)["enabled"] is False
    assert recap("memory", "delete", "amy", "units", "--json").json()["deleted"] == 1
    assert recap("memory", "list", "amy", "--json").json()["memories"] == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("memory", "set", "amy", "Bad Key!", "x"), "memory key"),
        (("memory", "set", "amy", "k", "   "), "non-empty"),
        (("memory", "set", "amy", "k", "w " * 3_000), "at most 2000"),
        (("memory", "set", "", "k", "x"), "user id"),
        (("memory", "delete", "amy"), "--yes"),
        (("memory", "list", "a\x01b"), "user id"),
        (("memory", "extract", "amy", "no-such-conversation"), "unknown conversation"),
    ],
)
def test_the_cli_refuses_bad_input_in_one_line_and_changes_nothing(
    sqlite_engine: Engine, tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    recap("memory", "set", "amy", "units", "metric")
    before = snapshot(sqlite_engine, tmp_path)
    assert_refused(recap(*args), FAILED, fragment)
    assert snapshot(sqlite_engine, tmp_path) == before


def test_the_cli_refuses_past_the_cap(sqlite_engine: Engine, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("RECAP_MEMORY_MAX_TOKENS", "10")
    before = snapshot(sqlite_engine, tmp_path)
    assert_refused(recap("memory", "set", "amy", "k", "word " * 20), FAILED, "cap of 10")
    assert snapshot(sqlite_engine, tmp_path) == before


def test_the_adapters_host_loop_carries_the_users_memory(sqlite_engine: Engine) -> None:
    """The loop the LangChain and Pydantic AI adapters share (and the Agents SDK session's
    assembly) sends the memory of the user it was given, and no other."""
    from recap.integrations import _loop

    r = Recap(settings_for(sqlite_engine), sqlite_engine)
    r.set_memory("amy", "units", "The user uses metric units.")
    cid = chat(r, "how far is it?")
    loop = _loop.HostLoop(r, user_id="amy")
    sent = loop.assemble(cid, system="Be brief.", tools=None, reserve=None)
    assert "metric units" in json.dumps(sent.history)
    nobody = _loop.HostLoop(r).assemble(cid, system="Be brief.", tools=None, reserve=None)
    assert "metric units" not in json.dumps(nobody.history)


def test_stats_and_the_trigger_plan_with_the_memory_sent(sqlite_engine: Engine) -> None:
    """The memory message is recorded with the fixed parts: `stats` (and the trigger, which
    plans with the same profile) counts what the user's last request really carried."""
    r = Recap(settings_for(sqlite_engine), sqlite_engine)
    r.set_memory("amy", "units", "The user uses metric units in every answer.")
    cid = chat(r, "how far is it?")
    r.assemble(cid, system="Be brief.")
    plain = r.stats(cid).used
    request = r.assemble(cid, system="Be brief.", user_id="amy")
    assert request.tokens.memory > 0
    assert r.stats(cid).used == plain + request.tokens.memory
