"""`recap serve` under hostile load: the full runs of the suite's seeded subsets.

- ``hostile_race_errors``, ``hostile_race_forks``, ``hostile_race_duplicates``: two `recap serve`
  processes on one fresh PostgreSQL database, 100 rounds of 16 clients released at once, each
  sending the first turn of one of 4 new conversations (so every conversation is created by
  several clients on both processes at once). Errors are any answer but a 200; a fork is a second
  child of one message, a duplicate one message stored twice. All must be 0.
- ``hostile_fuzz_500s`` over ``hostile_fuzz_cases``: hypothesis over the chat-completions request
  model (``tests.support.hostile_clients.request_bodies``: wrong types, unknown parts, NaN, odd
  JSON, conversation ids of any script), seeded, against serve on SQLite on each upstream path, in
  front of a stand-in upstream; no response may be a 500.

- ``hostile_relay_mask_mismatches`` over ``hostile_relay_mask_cases``: seeded random streamed
  replies (reasoning, text, tool calls, each text around known secrets and URL passwords, split
  at random) through the stream reader every API's relay shares; a mismatch is a stored reply,
  Responses item or Messages block that differs from masking its text whole. Must be 0.
- ``hostile_relay_mask_cost``: the relay's CPU time for a 2,000-chunk text stream with three
  known secrets over the same relay with none (no text held, no string looked at twice).

Counts, not timings, but for the one ratio: they mean the same on any machine.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench import Figure
from bench.add import _postgres_database

KEY = "bench-hostile-key-0001"
MODEL = "openai/stand-in"
RACE_ROUNDS = 100
RACE_CLIENTS = 16
RACE_CONVERSATIONS = 4
FUZZ_CASES = {"direct": 3_000, "litellm": 1_000}  # the litellm path is slower per request
SEED = 27


def _env(db_url: str, upstream: str, folder: Path, client: str = "auto") -> dict[str, str]:
    from tests.support.serve_stack import serve_env

    return serve_env(
        db_url,
        folder,
        keys=KEY,
        upstream=upstream,
        upstream_key="sk-upstream-bench-0123456789abcdef",
        window=8_000,
        RECAP_UPSTREAM_CLIENT=client,
    )


def race(root: Path, upstream: str) -> list[Figure]:
    """The 100 rounds on two processes; no figures when PostgreSQL is not reachable."""
    from contextlib import ExitStack

    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.support.hostile_clients import first_turn_rounds
    from tests.support.serve_stack import serve_process

    database = _postgres_database()
    if database is None:
        print(
            "bench.serve_hostile: PostgreSQL not reachable, the race is left out", file=sys.stderr
        )
        return []
    url, drop = database
    engine = make_engine(url)
    try:
        upgrade(engine)
        with ExitStack() as stack:
            urls = [
                stack.enter_context(
                    serve_process(_env(url, upstream, root / f"race{n}"), root / f"race{n}")
                ).base_url
                for n in range(2)
            ]
            outcome = first_turn_rounds(
                urls,
                engine,
                key=KEY,
                model=MODEL,
                rounds=RACE_ROUNDS,
                clients=RACE_CLIENTS,
                conversations=RACE_CONVERSATIONS,
                seed=SEED,
            )
    finally:
        engine.dispose()
        drop()
    for error in outcome.errors[:5]:
        print(f"bench.serve_hostile: {error}", file=sys.stderr)
    what = (
        f"of {outcome.turns} first turns: {RACE_ROUNDS} rounds of {RACE_CLIENTS} clients on two "
        f"serve processes, one PostgreSQL, {RACE_CONVERSATIONS} new conversations a round"
    )
    return [
        Figure("hostile_race_errors", len(outcome.errors), "== 0", f"answers but 200 {what}"),
        Figure("hostile_race_forks", outcome.forks, "== 0", f"second children of a message {what}"),
        Figure(
            "hostile_race_duplicates", outcome.duplicates, "== 0", f"messages stored twice {what}"
        ),
    ]


def fuzz(root: Path, upstream: str) -> list[Figure]:
    """The seeded fuzz on each upstream path."""
    from hypothesis import HealthCheck, given, seed, settings

    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.support.hostile_clients import fuzz_once, request_bodies
    from tests.support.serve_stack import serve_process

    statuses: Counter[int] = Counter()
    for path, cases in FUZZ_CASES.items():
        folder = root / f"fuzz-{path}"
        folder.mkdir()
        url = f"sqlite:///{folder / 'recap.db'}"
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        with serve_process(_env(url, upstream, folder, path), folder) as process:
            base = process.base_url

            @seed(SEED)
            @settings(
                max_examples=cases,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            @given(request_bodies(MODEL))
            def one(case: tuple[dict[str, Any], str | None]) -> None:
                statuses[fuzz_once(base, KEY, *case)] += 1  # noqa: B023 (called right here)

            one()
    print(f"bench.serve_hostile: fuzz statuses {dict(sorted(statuses.items()))}", file=sys.stderr)
    total = sum(statuses.values())
    return [
        Figure(
            "hostile_fuzz_500s",
            statuses[500],
            "== 0",
            "responses of 500 to fuzzed chat-completions requests (hypothesis over the request "
            "model, seeded), direct and litellm paths",
        ),
        Figure("hostile_fuzz_cases", total, "", "fuzzed requests sent (valid and not)"),
    ]


RELAY_CASES = 20_000
RELAY_CHUNKS = 2_000
RELAY_SECRETS = [
    "sk-upstream-bench-0123456789abcdef",
    "sk-summary-bench-fedcba9876543210",
    "db-pass-w0rd-bench",
]


def relay() -> list[Figure]:
    """The seeded relay cases, and what masking costs the relay per stream."""
    import asyncio
    import json
    import random

    from bench import best_of_each
    from tests.support.hostile_upstream import random_reply, relay_mismatches, text_chunks
    from recap.workers.serve.direct import Chunk
    from recap.workers.serve.streaming import Relay

    rng = random.Random(SEED)
    mismatched = sum(
        bool(relay_mismatches(random_reply(rng, RELAY_SECRETS), RELAY_SECRETS))
        for _ in range(RELAY_CASES)
    )
    raws = [json.dumps(c).encode() for c in text_chunks([f" w{i}" for i in range(RELAY_CHUNKS)])]

    def relayed(secrets: list[str]) -> None:
        async def stream() -> Any:
            for raw in raws:
                yield Chunk(raw, json.loads(raw))

        async def drain() -> None:
            async for _ in Relay(stream(), include_usage=True, secrets=secrets):
                pass

        asyncio.run(drain())

    masked, plain = best_of_each([lambda: relayed(RELAY_SECRETS), lambda: relayed([])], 7)
    return [
        Figure(
            "hostile_relay_mask_mismatches",
            mismatched,
            "== 0",
            f"of {RELAY_CASES} seeded streamed replies, those whose stored reply, Responses "
            "items or Messages blocks differ from masking each text whole",
        ),
        Figure("hostile_relay_mask_cases", RELAY_CASES, "", "seeded streamed replies relayed"),
        Figure(
            "hostile_relay_mask_cost",
            round(masked / plain, 3),
            "",
            f"relay CPU time for a {RELAY_CHUNKS}-chunk text stream with 3 known secrets over "
            "the same relay with none; best of 7",
        ),
    ]


def run() -> list[Figure]:
    from tests.support.hostile_upstream import HostileUpstream

    upstream = HostileUpstream().start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            return relay() + race(root, upstream.url) + fuzz(root, upstream.url)
    finally:
        upstream.stop()
