"""Counts follow the encoding: a conversation moved from an o200k model (gpt-4o) to a cl100k one
(gpt-4) gets its stored counts recounted, lazily on the request path (once per row) and in
batches off it; the ``encoding`` column decides, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, select

from recap.core import service
from recap.core.counting import tokens
from recap.core.settings import Settings
from recap.core.storage import recount
from recap.core.storage.db import session_scope
from recap.core.storage.models import CLEARINGS, MESSAGES
from recap.core.storage.reads import load_request_branch
from recap.core.storage.sweep import apply_clearings
from recap.core.values.clearing import ClearingPlan, PlannedClearing
from tests.support.token_check import assert_counts_cover

OLD, NEW = "gpt-4o", "gpt-4"  # o200k_base, then cl100k_base
# Text the two encodings split differently (code, CJK, numbers), so every count changes.
TEXTS = [
    "def parse(line):\n    return [int(x) for x in line.split(',') if x.strip()]",
    "日志显示解析器在第 42 行失败, 请检查输入文件的编码。",
    "Les résultats: 3.14159, 2.71828 et 1.41421 sont arrondis à cinq décimales.",
]
TURNS = 12  # user turns: more than the small window holds, so a request reads only the newest


def conversation() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You help."}]
    for turn in range(TURNS):
        text = TEXTS[turn % len(TEXTS)]
        messages.append({"role": "user", "content": f"{turn}: {text}"})
        call = {
            "id": f"c{turn}",
            "type": "function",
            "function": {"name": "run", "arguments": text},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": text * 3})
        messages.append({"role": "assistant", "content": text})
    return messages


def rows(engine: Engine, cid: str) -> dict[int, tuple[int, str]]:
    c = MESSAGES.c
    with engine.connect() as connection:
        found = connection.execute(
            select(c.id, c.tokens, c.encoding).where(c.conversation_id == cid).order_by(c.id)
        )
        return {int(r[0]): (int(r[1]), str(r[2])) for r in found}


def expected(engine: Engine, cid: str, model: str) -> dict[int, int]:
    """Every row counted afresh for ``model``."""
    encoding = tokens.encoding_name_for(model)
    branch = service.export_conversation(engine, cid)["messages"]
    return {
        m["id"]: tokens.count_message(
            {k: v for k, v in m.items() if k != "id"}, encoding, model=model
        )
        for m in branch
    }


@pytest.fixture
def moved(engine: Engine, settings: Settings) -> tuple[Engine, str]:
    record = {"id": "moved", "messages": conversation()}
    service.import_conversations(engine, [record], settings, model=OLD)
    return engine, "moved"


def test_counts_differ_between_the_encodings(moved: tuple[Engine, str]) -> None:
    """The premise: the old counts are wrong for the new model, row by row."""
    engine, cid = moved
    stored = rows(engine, cid)
    assert {basis for _, basis in stored.values()} == {tokens.O200K}
    fresh = expected(engine, cid, NEW)
    assert sum(fresh[mid] != count for mid, (count, _) in stored.items()) > len(stored) // 2


def test_request_path_recounts_what_it_reads_once(
    moved: tuple[Engine, str], settings: Settings
) -> None:
    """After the move, a request recounts the rows it reads, writes them back, and counts its
    total with the new encoding; the next request finds nothing to recount."""
    engine, cid = moved
    assert recount.set_model(engine, cid, NEW, max_input_tokens=1_500) is True
    request = service.assemble(engine, cid, settings)
    assert request.dropped_message_ids  # the window holds only the newest part
    assert_counts_cover(request, model=NEW)
    assert request.tokens.total == tokens.count_messages(request.messages, tokens.CL100K)
    stored, fresh = rows(engine, cid), expected(engine, cid, NEW)
    sent = [mid for mid in stored if mid not in request.dropped_message_ids]
    assert all(stored[mid] == (fresh[mid], tokens.CL100K) for mid in sent)
    assert any(stored[mid][1] == tokens.O200K for mid in request.dropped_message_ids)
    with session_scope(engine) as session:
        loaded = load_request_branch(session, cid, None, request.budget)
        assert set(loaded.bases) == {m.id for m in loaded.branch}
        assert recount.refreshed(loaded, NEW)[1] == []


def test_batches_recount_the_rest(moved: tuple[Engine, str]) -> None:
    """The maintenance path recounts every stale row in batches; a second run finds none."""
    engine, cid = moved
    recount.set_model(engine, cid, NEW)
    first = recount.recount_conversation(engine, cid, batch=7, max_batches=2)
    assert first.examined == 14 and first.more is True
    rest = recount.recount_conversation(engine, cid, batch=7, after_id=first.last_message_id)
    assert rest.more is False
    assert first.recounted + rest.recounted == len(rows(engine, cid))
    fresh = expected(engine, cid, NEW)
    assert rows(engine, cid) == {mid: (count, tokens.CL100K) for mid, count in fresh.items()}
    assert recount.recount_conversation(engine, cid).recounted == 0


def test_a_cleared_result_keeps_its_placeholder_cost(moved: tuple[Engine, str]) -> None:
    """A recount moves a clearing's saving with its row: the result still costs its
    placeholder, not the difference between the encodings."""
    engine, cid = moved
    stored = rows(engine, cid)
    tool_id = sorted(stored)[3]  # the first tool result
    with session_scope(engine) as session:
        apply_clearings(
            session,
            cid,
            ClearingPlan("idle", (PlannedClearing(message_id=tool_id, tokens_reclaimed=100),)),
        )
    placeholder_cost = stored[tool_id][0] - 100
    recount.set_model(engine, cid, NEW)
    recount.recount_conversation(engine, cid)
    with engine.connect() as connection:
        saved = connection.execute(
            select(CLEARINGS.c.tokens_reclaimed).where(CLEARINGS.c.message_id == tool_id)
        ).scalar_one()
    assert rows(engine, cid)[tool_id][0] - int(saved) == placeholder_cost


def test_a_preview_with_another_model_writes_nothing(
    moved: tuple[Engine, str], settings: Settings
) -> None:
    """``assemble --model`` of another family counts that request exactly, and leaves the
    conversation's counts as they are (its model did not change)."""
    engine, cid = moved
    before = rows(engine, cid)
    request = service.assemble(engine, cid, settings, model=NEW, max_input_tokens=200_000)
    assert request.tokens.total == tokens.count_messages(request.messages, tokens.CL100K)
    assert rows(engine, cid) == before


def test_same_basis_needs_no_recount(moved: tuple[Engine, str]) -> None:
    """A move within one encoding (and no reasoning) recounts nothing."""
    engine, cid = moved
    assert recount.set_model(engine, cid, "gpt-4o-mini") is False
    assert recount.recount_conversation(engine, cid).recounted == 0


def test_unknown_conversation_and_model(engine: Engine) -> None:
    """Bad input is one clear error and changes nothing."""
    from recap.core.counting.tokens import UnknownModelError
    from recap.core.errors import NotFoundError

    with pytest.raises(NotFoundError):
        recount.set_model(engine, "nope", NEW)
    with pytest.raises(UnknownModelError):
        recount.set_model(engine, "nope", "no-such-model-xyz")
