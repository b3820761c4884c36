"""Two `recap serve` processes on one PostgreSQL database, many clients sending the first turns
of the same new conversations at once: no error ("already exists" was one in about a hundred
rounds), no fork, no duplicate. The suite runs a seeded few rounds; ``bench.serve_hostile``
runs the hundred.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from tests.support.hostile_clients import first_turn_rounds
from tests.support.hostile_upstream import HostileUpstream
from tests.support.serve_stack import serve_env, serve_process

KEY = "client-key-race-1111"
MODEL = "openai/stand-in"
UPSTREAM_KEY = "sk-upstream-race-0123456789"
SUITE_ROUNDS = 5  # seeded; bench.serve_hostile runs 100


@pytest.fixture
def two_serves(postgres_url: str, tmp_path: Path) -> Iterator[list[str]]:
    """Two serve processes on one fresh PostgreSQL database; their base URLs."""
    upstream = HostileUpstream().start()
    engine = make_engine(postgres_url)
    upgrade(engine)
    engine.dispose()
    try:
        with ExitStack() as stack:
            urls = [
                stack.enter_context(
                    serve_process(_env(postgres_url, upstream.url, tmp_path / f"s{n}"),
                                  tmp_path / f"s{n}")
                ).base_url
                for n in range(2)
            ]  # fmt: skip
            yield urls
    finally:
        upstream.stop()


def _env(db_url: str, upstream_url: str, folder: Path) -> dict[str, str]:
    return serve_env(
        db_url, folder, keys=KEY, upstream=upstream_url, upstream_key=UPSTREAM_KEY, window=8_000
    )


def test_first_turns_from_two_processes_at_once(postgres_url: str, two_serves: list[str]) -> None:
    """16 clients, 4 new conversations a round, spread over both processes: every turn
    answered, each conversation one user message and one reply."""
    engine = make_engine(postgres_url)
    try:
        outcome = first_turn_rounds(
            two_serves, engine, key=KEY, model=MODEL, rounds=SUITE_ROUNDS, seed=27
        )
    finally:
        engine.dispose()
    assert outcome.turns == SUITE_ROUNDS * 16
    assert outcome.errors == []
    assert (outcome.forks, outcome.duplicates) == (0, 0)
