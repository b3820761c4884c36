"""Recall's answers stay within their cap and always say something: errors included, an offset
past the end included, and a reference or an id a caller sent is never echoed whole.

Seeded: references and offsets are drawn at random against a stored conversation, and every
answer is held to the cap and to being non-empty.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from sqlalchemy import Engine

from recap.core import recall as recalls
from recap.core import service
from recap.core.client import Recap
from recap.core.errors import InputError
from recap.core.settings import get_settings
from tests.support.cli_helpers import assert_one_line_error, recap

CAP = 2_000  # RECAP_RECALL_MAX_CHARS in these tests
LONG_REF = "m" + "1" * 50_000  # a 50,000-character reference


def _stored(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> tuple[Recap, list[Any]]:
    monkeypatch.setenv("RECAP_RECALL_MAX_CHARS", str(CAP))
    get_settings.cache_clear()
    client = Recap(get_settings(), engine)
    messages = [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": "reading " + "y" * 5_000},
        {"role": "user", "content": "thanks"},
    ]
    service.import_conversations(
        engine, [{"id": "r", "messages": messages}], client.settings, prepare=client._ingest
    )
    return client, list(service.export_conversation(engine, "r")["messages"])


def test_errors_are_capped_and_never_echo_a_long_reference(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 50,000-character reference: the answer is within the cap, and the error names a
    short piece of the reference, not all of it."""
    client, _messages = _stored(sqlite_engine, monkeypatch)
    for arguments in (
        {"ref": LONG_REF},
        {"ref": "z" * 50_000},
        {"ref": "m1", "offset": 10**40},
        json.dumps({"ref": "m1", "offset": "q" * 60_000}),
        "{" + "x" * 60_000,
    ):
        text = recalls.answer(sqlite_engine, "r", arguments, client.settings)
        assert text.startswith("[recap_recall:") and len(text) <= CAP
    with pytest.raises(InputError) as caught:
        client.recall("r", "z" * 50_000)
    assert len(str(caught.value)) < 300
    assert_one_line_error(recap("recall", "r", "z" * 5_000), "not a recall reference")


def test_an_offset_past_the_end_answers_a_line(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the end of a message, a model gets a line saying so (not an empty answer), and the
    host an ``InputError`` naming where the text ends; the last page itself still answers."""
    client, messages = _stored(sqlite_engine, monkeypatch)
    ref = f"m{messages[1]['id']}"
    whole = client.recall("r", ref, max_chars=100_000)
    length = len(whole.text)
    last = client.recall("r", ref, offset=length - 1)
    assert last.text and last.next_offset is None
    text = recalls.answer(sqlite_engine, "r", {"ref": ref, "offset": length + 500}, client.settings)
    assert text.startswith("[recap_recall:") and "past the end" in text
    with pytest.raises(InputError, match="past the end"):
        client.recall("r", ref, offset=length)


def test_seeded_answers_are_within_the_cap_and_never_empty(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random references (good, malformed, unknown, huge) and offsets (inside, at and past the
    end): every answer is some text, at most the cap (or the smaller cap asked for)."""
    client, messages = _stored(sqlite_engine, monkeypatch)
    rng = random.Random(7)
    refs = [f"m{m['id']}" for m in messages] + ["m999999", "s1", "m1.3", "", "?", LONG_REF]
    for _ in range(200):
        ref = rng.choice(refs) if rng.random() < 0.8 else "m" + "9" * rng.randint(1, 3_000)
        offset: Any = rng.choice((0, 1, 50, 5_000, 5_050, 6_000, 10**9, -1, "3", None))
        arguments: dict[str, Any] = {"ref": ref}
        if offset is not None:
            arguments["offset"] = offset
        cap = rng.choice((None, 300, CAP))
        text = recalls.answer(sqlite_engine, "r", arguments, client.settings, max_chars=cap)
        assert text, arguments
        assert len(text) <= (cap or CAP), (arguments, len(text))
