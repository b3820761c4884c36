"""A user's memory on the request path: what sending it costs, and that it calls no model.

- ``memory_added_latency_vs_assemble``: ``assemble`` of a new turn of a 200-message conversation
  for a user with 50 memory entries (the user's switch read, the entries read, chosen within the
  cap and counted) over the same ``assemble`` for no user; both reuse the last turn's read, as
  ``Recap.assemble`` does, and write nothing; medians of alternating rounds of this process's
  CPU time (SQLite's reads included; other work on the machine left out), on SQLite.
- ``memory_model_calls_during_assemble``: requests that reached the memory model (a stand-in
  server, set as ``RECAP_MEMORY_MODEL`` with ``RECAP_MEMORY=on``) during every ``assemble`` of
  the run. Must be 0: extraction belongs to the worker, after the turn.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench import Figure
from bench.assemble import long_conversation
from bench.data import load_all

CONVERSATION = 200  # messages of the timed conversation
MEMORIES = 50  # entries of the timed user
ROUNDS = 61  # timed rounds, alternating the two sides
USER = "bench-user"


def run() -> list[Figure]:
    from recap.core.settings import Settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.support.llm_server import LLMServer

    llm = LLMServer().start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            settings = Settings(
                database_url=f"sqlite:///{root / 'memory.db'}",
                output_dir=root / "out",
                memory="on",
                memory_model="openai/stand-in",
                summary_api_base=llm.url,
            )
            engine = make_engine(settings.database_url)
            upgrade(engine)
            ratio, with_ms, without_ms, sent = _timed(engine, settings)
            engine.dispose()
        calls = len(llm.requests)
    finally:
        llm.stop()
    return [
        Figure(
            "memory_added_latency_vs_assemble",
            round(ratio, 3),
            "<= 1.2",
            f"assemble of a new turn of a {CONVERSATION}-message conversation for a user with "
            f"{MEMORIES} memory entries ({sent} sent, {with_ms:.2f} ms) over the same assemble "
            f"for no user ({without_ms:.2f} ms); both reuse the last read, SQLite, medians of "
            "alternating rounds of CPU time",
        ),
        Figure(
            "memory_model_calls_during_assemble",
            calls,
            "== 0",
            f"requests that reached the memory model during {2 * ROUNDS + 2} assembles with "
            "RECAP_MEMORY=on (extraction runs in the worker, after the turn)",
        ),
    ]


def _timed(engine: object, settings: object) -> tuple[float, float, float, int]:
    from sqlalchemy import Engine

    from recap.core import service
    from recap.core.settings import Settings
    from recap.core.storage import memories
    from recap.core.storage.reuse import BranchReuse
    from recap.core.values.request import RequestSpec

    assert isinstance(engine, Engine) and isinstance(settings, Settings)
    for n in range(MEMORIES):
        memories.set_memory(
            engine, USER, f"fact-{n:02d}", f"The user said fact number {n} about themselves.",
            cap=settings.memory_max_tokens,
        )  # fmt: skip
    cid = service.new_conversation(engine, settings, "timed", model="gpt-4o")
    service.add_many(engine, cid, long_conversation(load_all(), CONVERSATION))
    plain, remembered = (
        RequestSpec(system="Be brief."),
        RequestSpec(system="Be brief.", user_id=USER),
    )
    reuse_with, reuse_without = BranchReuse(), BranchReuse()
    sent = service.assemble(engine, cid, settings, remembered, reuse=reuse_with, record=False)
    service.assemble(engine, cid, settings, plain, reuse=reuse_without, record=False)
    with_: list[float] = []
    without: list[float] = []
    for n in range(ROUNDS):
        service.add_message(engine, cid, {"role": "user", "content": f"next step {n}"})
        sides = [(remembered, reuse_with, with_), (plain, reuse_without, without)]
        for spec, reuse, times in sides if n % 2 else sides[::-1]:
            started = time.process_time()
            service.assemble(engine, cid, settings, spec, reuse=reuse, record=False)
            times.append(time.process_time() - started)
        service.add_message(engine, cid, {"role": "assistant", "content": f"done {n}"})
    with_ms, without_ms = statistics.median(with_) * 1000, statistics.median(without) * 1000
    count = sum(1 for line in sent.messages[1]["content"].splitlines() if line.startswith("- "))
    return with_ms / without_ms, with_ms, without_ms, count
