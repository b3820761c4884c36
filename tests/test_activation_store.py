"""Summary activation on a real database: a compression run writes its summary pending; a request
while the cache is warm and the request fits keeps the summary in use before it; a request after
the cache's lifetime, or one that would not fit, uses it, records its first use, and every request
after keeps it. ``stats`` and the timeline show a summary that waits."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from recap.core import lifecycle
from recap.core.client import Recap
from recap.core.settings import Settings
from recap.core.storage.models import utcnow
from recap.workers.ui.timeline import Band
from recap.workers.ui.views import conversation_view

MODEL = "anthropic/claude-sonnet-4-5"
WINDOW = 24_000


def filler(index: int, words: int = 180) -> str:
    return f"step {index}: " + " ".join(f"word{index}x{n}" for n in range(words))


@pytest.fixture
def recap(db_url: str, tmp_path: Path) -> Recap:
    """On SQLite and PostgreSQL (the migration's column and its in-place stamp on both)."""
    settings = Settings(
        database_url=db_url,
        output_dir=tmp_path / "o",
        activation_horizon_requests=1,  # one request never pays a rewrite back: waits warm
    )
    return Recap(settings, create_schema=True)


def grown(recap: Recap, turns: int = 14) -> str:
    cid = recap.new(model=MODEL, max_input_tokens=WINDOW)
    recap.add(cid, {"role": "system", "content": "You are terse."})
    for turn in range(turns):
        recap.add(cid, {"role": "user", "content": filler(turn)})
        recap.add(cid, {"role": "assistant", "content": filler(turn + 1000, 60)})
    return cid


def summaries(recap: Recap, cid: str) -> list[tuple[int, bool, object]]:
    with recap.engine.connect() as connection:
        rows = connection.execute(
            text("SELECT id, pending, activated_at FROM summaries WHERE conversation_id = :c"),
            {"c": cid},
        )
        return [(int(r[0]), bool(r[1]), r[2]) for r in rows]


def age_last_request(recap: Recap, cid: str, seconds: float) -> None:
    """The last request assembled ``seconds`` ago (as an idle user leaves it)."""
    then = utcnow() - timedelta(seconds=seconds)
    with recap.engine.begin() as connection:
        connection.execute(
            text("UPDATE request_profiles SET assembled_at = :t WHERE conversation_id = :c"),
            {"t": then, "c": cid},
        )


def test_warm_waits_then_cold_uses_it_and_it_stays(recap: Recap) -> None:
    cid = grown(recap)
    first = recap.assemble(cid)
    assert first.summary_id is None
    result = recap.compress(cid, force=True)
    assert result.summary_id is not None
    [(sid, pending, activated)] = summaries(recap, cid)
    assert pending and activated is None
    stats = recap.stats(cid)
    assert stats.summary_waiting
    warm = recap.assemble(cid)
    assert warm.summary_id is None  # the cache is warm and the request fits: it waits
    assert warm.messages == first.messages  # byte for byte the cached request
    spans = lifecycle.timeline(recap.engine, cid, recap.settings).summaries
    assert [s.waiting for s in spans] == [True] and not spans[0].sent
    page = conversation_view(recap.engine, recap.settings, cid, None)  # the console's page
    bands = [item for item in page.items if isinstance(item, Band)]
    assert [(b.summary.id, b.summary.pending, b.in_effect) for b in bands] == [(sid, True, False)]
    age_last_request(recap, cid, 301)  # past Anthropic's five minutes
    cold = recap.assemble(cid)
    assert cold.summary_id == sid
    [(_, pending, activated)] = summaries(recap, cid)
    assert not pending and activated is not None
    assert not recap.stats(cid).summary_waiting
    again = recap.assemble(cid)  # warm again, yet a summary in use stays in use
    assert again.summary_id == sid


def test_needed_uses_it_while_warm(recap: Recap) -> None:
    cid = grown(recap)
    recap.assemble(cid)
    recap.compress(cid, force=True)
    assert recap.assemble(cid).summary_id is None
    # a step as large as the room left: the request without the summary would not fit
    room = WINDOW - recap.assemble(cid).tokens.total
    recap.add(cid, {"role": "user", "content": filler(99, words=room // 2)})
    used = recap.assemble(cid)
    assert used.summary_id is not None
    assert summaries(recap, cid)[0][1] is False


def test_horizon_zero_uses_it_at_once(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'z.db'}",
        output_dir=tmp_path / "o",
        activation_horizon_requests=0,
    )
    recap = Recap(settings, create_schema=True)
    cid = grown(recap)
    recap.assemble(cid)
    recap.compress(cid, force=True)
    assert recap.assemble(cid).summary_id is not None
