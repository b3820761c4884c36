"""Attach and merge end to end on SQLite and PostgreSQL (``Recap.attach``, ``Recap.merge``):
the markers and provenance in the request, once across turns, the fallback after the source is
erased (never its text), another owner's source refused, a merge's locked base and its commit's
parents, and the CLI's ``recap attach`` / ``recap merge``."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from recap.core.client import Recap
from recap.core.errors import InputError, NotFoundError
from recap.core.request.attach import close_text, fallback_text, open_text
from recap.core.settings import get_settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import ATTACHMENTS, CONVERSATIONS, MESSAGES
from recap.core.storage.sweep import apply_clearings
from recap.core.values.clearing import ClearingPlan, PlannedClearing


def client(engine: Engine) -> Recap:
    return Recap(get_settings(), engine)


def texts(request: Any) -> list[str]:
    return [str(m.get("content")) for m in request.messages]


def joined(request: Any) -> str:
    return "\n".join(texts(request))


def sub_agent(recap: Recap, cid: str = "sub") -> list[int]:
    recap.new(cid, model="gpt-4o", max_input_tokens=100_000)
    return recap.add_many(
        cid,
        [
            {"role": "user", "content": "find the invoice total"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "total: 4711 EUR"},
            {"role": "assistant", "content": "The total is 4711 EUR."},
        ],
    )


def parent(recap: Recap, cid: str = "parent") -> None:
    recap.new(cid, model="gpt-4o", max_input_tokens=100_000)
    recap.add(cid, {"role": "user", "content": "what do we owe?"})
    recap.add(cid, {"role": "assistant", "content": "Let me ask the helper."})


def test_attach_expands_between_markers_once(engine: Engine) -> None:
    recap = client(engine)
    sub_ids = sub_agent(recap)
    parent(recap)
    made = recap.attach("parent", source="sub")
    assert (made.source, made.leaf) == ("sub", sub_ids[-1])
    recap.add("parent", {"role": "user", "content": "so?"})
    first = recap.assemble("parent")
    t = texts(first)
    start = t.index(open_text("sub", sub_ids[-1]))
    end = t.index(close_text("sub"))
    assert start < t.index("find the invoice total") < t.index("total: 4711 EUR") < end
    assert t.index("so?") > end
    assert first.provenance == {mid: f"sub:{mid}" for mid in sub_ids}
    assert [b.items for b in first.attachments] == [tuple(sub_ids)]
    # tool pair intact
    call = next(m for m in first.messages if m.get("tool_calls"))
    assert first.messages[first.messages.index(call) + 1]["tool_call_id"] == "c1"
    # a later request carries it at the same place, once
    recap.add("parent", {"role": "assistant", "content": "We owe 4711 EUR."})
    recap.add("parent", {"role": "user", "content": "thanks"})
    later = recap.assemble("parent")
    assert texts(later)[: len(t)] == t
    assert joined(later).count("total: 4711 EUR") == 1
    # counted like ordinary items: the same messages stored inline count the same, but for the
    # two markers
    recap.new("inline", model="gpt-4o", max_input_tokens=100_000)
    own = [{k: v for k, v in m.items() if k != "id"} for m in recap.export("parent")["messages"]]
    sub = [{k: v for k, v in m.items() if k != "id"} for m in recap.export("sub")["messages"]]
    recap.add_many("inline", [*own[:2], *sub, own[4]])
    inline = recap.assemble("inline")
    markers = first.tokens.history - inline.tokens.history
    assert 0 < markers < 80, markers
    assert later.tokens.history > first.tokens.history


def test_erased_source_leaves_the_fallback(engine: Engine) -> None:
    recap = client(engine)
    sub_agent(recap)
    parent(recap)
    recap.attach("parent", source="sub")
    recap.add("parent", {"role": "user", "content": "so?"})
    assert "4711" in joined(recap.assemble("parent"))
    recap.delete("sub")
    request = recap.assemble("parent")
    assert "4711" not in joined(request)
    assert "invoice" not in joined(request)
    assert fallback_text("sub") in texts(request)
    assert close_text("sub") not in texts(request)
    assert request.attachments[0].fallback
    # created again under the same id: another conversation, still the fallback
    sub_agent(recap)
    assert "4711" not in joined(recap.assemble("parent"))


def test_another_owners_source_is_refused(engine: Engine) -> None:
    recap = client(engine)
    sub_agent(recap)
    parent(recap)
    with session_scope(engine) as session:
        session.connection().execute(
            update(CONVERSATIONS).where(CONVERSATIONS.c.id == "sub").values(owner="a" * 64)
        )
    with pytest.raises(NotFoundError, match="unknown conversation 'sub'"):
        recap.attach("parent", source="sub")
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(ATTACHMENTS)).scalar() == 0
        count = select(func.count()).where(MESSAGES.c.conversation_id == "parent")
        assert connection.execute(count).scalar() == 2


def test_attach_bad_input(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    recap = client(engine)
    sub_agent(recap)
    parent(recap)
    with pytest.raises(NotFoundError):
        recap.attach("parent", source="nope")
    with pytest.raises(NotFoundError):
        recap.attach("nope", source="sub")
    with pytest.raises(NotFoundError):
        recap.attach("parent", source="sub", leaf=10**9)
    recap.add(
        "parent",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
    )
    with pytest.raises(InputError, match="tool calls"):
        recap.attach("parent", source="sub")


def branches(recap: Recap) -> tuple[int, int, int]:
    """One conversation: a shared question, then two explorations from it."""
    recap.new("m", model="gpt-4o", max_input_tokens=100_000)
    root = recap.add("m", {"role": "user", "content": "pick a database"})
    recap.add("m", {"role": "assistant", "content": "main: thinking"})
    recap.add(
        "m",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a1", "type": "function", "function": {"name": "bench", "arguments": "{}"}}
            ],
        },
        parent_id=root,
    )
    recap.add("m", {"role": "tool", "tool_call_id": "a1", "content": "postgres wins " * 20})
    peer_a = recap.add("m", {"role": "assistant", "content": "A: postgres"})
    b1 = recap.add("m", {"role": "assistant", "content": "B: sqlite is enough"}, parent_id=root)
    main = recap.add("m", {"role": "user", "content": "main: go on"}, parent_id=root + 1)
    assert b1 and main
    return main, peer_a, b1


def test_merge_locked_base_and_commit_parents(engine: Engine) -> None:
    recap = client(engine)
    main, peer_a, peer_b = branches(recap)
    # the base peer's tool result was cleared for this conversation's requests
    with session_scope(engine) as session:
        apply_clearings(
            session,
            "m",
            ClearingPlan("test", (PlannedClearing(message_id=peer_a - 1, tokens_reclaimed=10),)),
        )
    started = recap.merge("m", peers=[peer_a, peer_b], instruction="merge the two", leaf=main)
    assert started.parents == [main, peer_a, peer_b]
    body = joined(started.request)
    assert body.count("postgres wins") == 20  # locked: sent as stored
    assert "B: sqlite is enough" in body and "merge the two" in texts(started.request)[-1]
    assert body.count("pick a database") == 1  # the shared root is not brought again
    assert recap.merges("m")[0]["commit"] is None
    reply = recap.add("m", {"role": "assistant", "content": "postgres, merged"})
    merged = recap.merges("m")
    assert merged == [
        {
            "merge": merged[0]["merge"],
            "instruction": started.instruction_id,
            "commit": reply,
            "parents": [main, peer_a, peer_b],
            "peers": [{"conversation": "m", "leaf": peer_a}, {"conversation": "m", "leaf": peer_b}],
        }
    ]
    # the base is unlocked once committed: its cleared result is a placeholder again
    recap.add("m", {"role": "user", "content": "next"})
    assert joined(recap.assemble("m")).count("postgres wins") < 20
    # only the merge's commit has several parents; a plain reply commits nothing
    recap.add("m", {"role": "assistant", "content": "ok"})
    assert [m["commit"] for m in recap.merges("m")] == [reply]


def test_merge_bad_input(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    recap = client(engine)
    main, peer_a, _ = branches(recap)
    with pytest.raises(InputError):
        recap.merge("m", peers=[], instruction="x", leaf=main)
    with pytest.raises(InputError):
        recap.merge("m", peers=[peer_a], instruction=" ", leaf=main)
    with pytest.raises(InputError, match="on the branch"):
        recap.merge("m", peers=[peer_a - 4], instruction="x", leaf=main)  # the root
    with pytest.raises(NotFoundError):
        recap.merge("m", peers=[10**9], instruction="x", leaf=main)
    with pytest.raises(InputError, match="twice"):
        recap.merge("m", peers=[peer_a, peer_a], instruction="x", leaf=main)
    recap.new("empty", model="gpt-4o")
    with pytest.raises(InputError, match="no messages"):
        recap.merge("m", peers=["empty"], instruction="x", leaf=main)
    with pytest.raises(InputError, match="on the branch"):
        recap.merge("m", peers=["m"], instruction="x", leaf=None)  # its head is the target's
    assert recap.merges("m") == []


def test_cli_attach_and_merge(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from tests.support.cli_helpers import assert_one_line_error
    from tests.support.cli_helpers import recap as cli

    monkeypatch.setenv("RECAP_DATABASE_URL", sqlite_url)
    assert cli("init").code == 0
    host = Recap(get_settings())
    sub_ids = sub_agent(host)
    parent(host)
    done = cli("attach", "parent", "--source", "sub", "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout)["leaf"] == sub_ids[-1]
    assert_one_line_error(cli("attach", "parent", "--source", "sub"), "attached already")
    assert_one_line_error(cli("attach", "parent", "--source", "nope"), "nope")
    main, peer_a, peer_b = branches(host)
    opened = cli(
        "merge",
        "m",
        "--peer",
        str(peer_a),
        "--peer",
        str(peer_b),
        "--instruction",
        "merge",
        "--leaf",
        str(main),
        "--json",
    )
    assert opened.code == 0, opened.stderr
    assert json.loads(opened.stdout)["parents"] == [main, peer_a, peer_b]
    assert_one_line_error(cli("merge", "m", "--peer", "nope", "--instruction", "x"), "nope")
    host.engine.dispose()


def test_console_and_timeline_show_attachments_and_merges(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's timeline marks each attached item with its provenance and lists the
    branch's merges with their parents; ``recap timeline`` gives each attached message a
    ``source`` and the merges."""
    from starlette.testclient import TestClient

    from recap.core import lifecycle
    from recap.workers.ui.app import standalone

    monkeypatch.setenv("RECAP_UI_KEYS", "console-operator-key")
    get_settings.cache_clear()
    recap = client(sqlite_engine)
    sub_ids = sub_agent(recap)
    main, peer_a, peer_b = branches(recap)
    recap.attach("m", source="sub")
    started = recap.merge("m", peers=[peer_a, peer_b], instruction="merge", leaf=None)
    reply = recap.add("m", {"role": "assistant", "content": "merged"})
    line = lifecycle.timeline(sqlite_engine, "m", recap.settings).as_dict()
    sources = {m["id"]: m.get("source") for m in line["messages"]}
    assert all(sources[mid] == f"sub:{mid}" for mid in sub_ids)
    assert line["merges"][0]["commit"] == reply
    assert line["merges"][0]["parents"] == started.parents
    http = TestClient(standalone(), base_url="http://127.0.0.1")
    assert (
        http.post(
            "/ui/login", data={"key": "console-operator-key"}, follow_redirects=False
        ).status_code
        == 303
    )
    page = http.get("/ui/c/m").text
    assert f'data-source="sub:{sub_ids[0]}"' in page
    parents = ", ".join(f"#{p}" for p in started.parents)
    assert f"committed by #{reply} with parents {parents}" in page
    assert main


def test_async_twins(sqlite_engine: Engine) -> None:
    import asyncio

    from recap.core.aio import AsyncRecap

    recap = client(sqlite_engine)
    sub_agent(recap)
    _, peer_a, _ = branches(recap)

    async def go() -> None:
        async with AsyncRecap(recap) as arecap:
            made = await arecap.attach("m", source="sub")
            started = await arecap.merge(
                "m", peers=[peer_a], instruction="merge", leaf=made.close_id
            )
            assert started.request is not None and started.parents == [made.close_id, peer_a]
            reply = await arecap.add("m", {"role": "assistant", "content": "merged"})
            assert [m["commit"] for m in await arecap.merges("m")] == [reply]

    asyncio.run(go())


def test_same_owner_attaches_another_does_not(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    """A serve key's conversations attach each other; another key's, or the library's, are
    refused as unknown."""
    recap = client(engine)
    sub_agent(recap)
    parent(recap)
    sub_agent(recap, "sub-b")
    owners = {"sub": "a" * 64, "parent": "a" * 64, "sub-b": "b" * 64}
    with session_scope(engine) as session:
        for cid, owner in owners.items():
            session.connection().execute(
                update(CONVERSATIONS).where(CONVERSATIONS.c.id == cid).values(owner=owner)
            )
    assert recap.attach("parent", source="sub").source == "sub"
    with pytest.raises(NotFoundError):
        recap.attach("parent", source="sub-b")
    recap.new("library", model="gpt-4o")
    recap.add("library", {"role": "user", "content": "hi"})
    with pytest.raises(NotFoundError):
        recap.attach("parent", source="library")
    with pytest.raises(NotFoundError):
        recap.attach("library", source="sub")


def attached_and_grown(engine: Engine) -> Recap:
    """The sub-agent attached to a 4k-window parent, then 12 turns after it: enough for a
    summary that covers the attachment."""
    recap = client(engine)
    sub_agent(recap)
    recap.new("parent", model="gpt-4o", max_input_tokens=4_000)
    recap.add("parent", {"role": "user", "content": "what do we owe?"})
    recap.add("parent", {"role": "assistant", "content": "Let me ask the helper."})
    recap.attach("parent", source="sub")
    for n in range(12):
        words = " ".join(f"q{n}w{i}" for i in range(120))
        recap.add("parent", {"role": "user", "content": f"question {n} {words}"})
        recap.add("parent", {"role": "assistant", "content": f"answer {n} {words}"})
    return recap


def test_erasing_a_source_drops_summaries_that_quote_it(engine: Engine) -> None:
    """A summary of the parent made over the attached items may quote them: erasing the source
    deletes it, so no request sends the erased text again (the fallback stands in its place)."""
    recap = attached_and_grown(engine)
    done = recap.compress("parent", force=True)
    assert done.action == "summarized"
    summary = recap.summaries("parent")[-1]
    with engine.connect() as connection:
        close = connection.execute(select(ATTACHMENTS.c.close_message_id)).scalar_one()
    assert summary.cutoff_message_id >= close
    assert "lookup" in joined(recap.assemble("parent"))  # the summary names the sub-agent's call
    deleted = recap.delete("sub")
    assert deleted["rows"]["attaching_summaries"] == 1
    assert recap.summaries("parent") == []
    request = joined(recap.assemble("parent"))
    assert "lookup" not in request and "4711" not in request and "invoice" not in request
    assert fallback_text("sub") in joined(recap.assemble("parent", max_input_tokens=100_000))


def test_a_source_erased_during_the_parents_run_is_never_summarized(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's run reads the attached items' text, then the source is erased before the
    run writes: the run writes no summary (it would quote the erased text; the erasure found
    none to delete), ends skipped, and the next run summarizes the fallback."""
    from recap.core.compression import run as runs

    recap = attached_and_grown(engine)
    read_text = runs.with_text
    erased: list[dict[str, Any]] = []

    def read_then_erase(*args: Any, **kwargs: Any) -> Any:
        split = read_text(*args, **kwargs)
        if not erased:  # the text is read; the source goes before the summary is written
            erased.append(client(engine).delete("sub"))
        return split

    monkeypatch.setattr(runs, "with_text", read_then_erase)
    done = recap.compress("parent", force=True)
    assert erased and erased[0]["rows"].get("attaching_summaries", 0) == 0
    assert done.action == "skipped" and "erased during the run" in done.reason
    assert done.tokens_after == done.tokens_before
    assert recap.summaries("parent") == []
    again = recap.compress("parent", force=True)
    assert again.action == "summarized"
    request = joined(recap.assemble("parent"))
    assert "lookup" not in request and "4711" not in request and "invoice" not in request
