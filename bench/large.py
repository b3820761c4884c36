"""Large tables: the reconcile query, the idle sweep and assembly in a 1,000,000-message database.

A PostgreSQL database of its own (``recap_bench_large`` on the server of
``RECAP_TEST_POSTGRES_URL``, schema by the project's migrations) holds 10,000 conversations and
1,000,000 messages, written in bulk with ``COPY``. The messages are the shared conversations one
after another (tool results, calls, user and assistant turns in their own proportions), each
synthetic conversation a slice of them with its call ids made its own; lengths follow a long
tail (up to 800 messages, median about 70). Long conversations carry progressive
summaries; their results before the first cutoff are cleared under pressure; most conversations
idle for more than a day were swept before (keeping the last result); a few are stale for
reconcile (dirty, never run, active since their last run, a dead run's lease). One of the 10,000
is a 5,000-message session imported through ``service.import_conversations``.

The database is built once and kept: a marker row written last says it is complete (and which
version of this generator built it), so a rerun only migrates it. ``python -m bench.large
--rebuild`` (or ``RECAP_BENCH_LARGE_REBUILD=1``) builds it again; ``--drop`` removes it.

Figures, each against the best single SQL statement doing the same job, interleaved, in the same
run (wall time: the server does the work in its own process):

- ``reconcile_pass_vs_index_scan``: reconcile's candidate query (``workers.reconcile.candidates``,
  a session and the query), median of its runs, over one ``SELECT`` of the same candidates by
  primary key (their ids given), through the same engine.
- ``sweep_pass_vs_raw_update``: ``core.storage.sweep.sweep_idle`` with the default settings over the
  whole table (every tool result examined, batch after batch), best of three, over one raw
  ``INSERT ... SELECT`` of the same clearing rows from a table of their ids.
- ``assemble_large_db_vs_small``: ``service.assemble`` of the 5,000-message conversation to JSON
  in the large database over the same in a database holding only that conversation (medians).
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, create_engine, text

from bench import Figure
from bench.assemble import long_conversation
from bench.data import load_all
from bench.services import POSTGRES_ADMIN_URL
from recap.core.storage.models import new_incarnation

MODEL = "gpt-4o-mini"
GENERATOR_VERSION = 1  # bump when the data changes: a database of another version is rebuilt
LARGE_DATABASE = "recap_bench_large"
SMALL_DATABASE = "recap_bench_large_empty"  # the 5,000-message conversation and nothing else
SERVER_URL = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
REBUILD_SETTING = "RECAP_BENCH_LARGE_REBUILD"
MARKER_TABLE = "bench_large_dataset"

CONVERSATIONS = 10_000
MESSAGES = 1_000_000
SESSION_ID = "bench-5000"  # the conversation assembled in both databases
SESSION_MESSAGES = 5_000
SEED = 14
MIN_LENGTH, MAX_LENGTH = 6, 800  # messages per synthetic conversation
LENGTH_SIGMA = 0.8  # spread of the log-normal lengths
SUMMARY_EVERY_TOKENS = 40_000  # a progressive summary each time this much more is stored
SUMMARY_TEXT = (
    "The user is debugging a failing test suite. Steps so far: read the failing test, ran it, "
    "found the fixture that leaks state, patched it, reran the suite (48 passed). "
) * 8
SUMMARY_TOKENS = 400
ACTIVE_SHARE = 0.02  # active within the last hour: not idle, the sweep leaves them
SWEPT_SHARE = 0.6  # of those idle for more than a day: swept before, their old results cleared
# reconcile's candidates among the rest: shares of all conversations
DIRTY_SHARE, NEVER_RUN_SHARE, ACTIVE_SINCE_SHARE = 0.01, 0.005, 0.01
DEAD_LEASE_SHARE, LIVE_LEASE_SHARE = 0.003, 0.002
IDLE_KEEP = 1  # results a past sweep kept (the default of RECAP_IDLE_KEEP_TOOL_RESULTS)
PLACEHOLDER_TOKENS = 30  # about what a placeholder costs; a past clearing reclaimed the rest

RECONCILE_RUNS = 41  # medians of this many interleaved runs of each side
SWEEP_RUNS = 3  # best of three, interleaved
ASSEMBLE_RUNS = 21

MESSAGE_COLUMNS = (
    "id, conversation_id, parent_id, role, content, content_parts, tool_calls, tool_call_id, "
    "name, extra, tokens, encoding, output_path, original_bytes, content_hash, created_at"
)
CONVERSATION_COLUMNS = (
    "id, model, max_input_tokens, meta, created_at, last_activity_at, lease_owner, "
    "lease_expires_at, dirty, last_compacted_at, owner, incarnation"
)
SUMMARY_COLUMNS = (
    "conversation_id, cutoff_message_id, previous_summary_id, text, tokens, encoding, model, "
    "input_tokens, output_tokens, identifier_retention, created_at"
)
CLEARING_COLUMNS = "conversation_id, message_id, reason, tokens_reclaimed, created_at"


# --- the dataset -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One shared message as stored, its call ids ready to be made a conversation's own."""

    role: str
    content: str | None
    content_parts: str | None
    tool_calls: str | None  # JSON with every call id followed by SUFFIX
    tool_call_id: str | None
    name: str | None
    extra: str | None
    tokens: int
    encoding: str
    content_hash: str | None


SUFFIX = "\x00"  # stands for a call id's suffix in ``Source.tool_calls`` until written


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def sources() -> list[list[Source]]:
    """The shared conversations as stored rows, tokens counted once per source message."""
    from recap.core.counting.tokens import encoding_name_for
    from recap.core.storage.store import row_values

    encoding = encoding_name_for(MODEL)
    out: list[list[Source]] = []
    for record in load_all():
        rows: list[Source] = []
        for message in record["messages"]:
            values = row_values(message, encoding, model=MODEL)
            calls = values["tool_calls"]
            if calls:
                calls = [{**call, "id": f"{call['id']}{SUFFIX}"} for call in calls]
            rows.append(
                Source(
                    role=values["role"],
                    content=values["content"],
                    content_parts=_json(values["content_parts"]),
                    tool_calls=json.dumps(calls).replace("\\u0000", SUFFIX) if calls else None,
                    tool_call_id=values["tool_call_id"],
                    name=values["name"],
                    extra=_json(values["extra"]),
                    tokens=int(values["tokens"]),
                    encoding=str(values["encoding"]),
                    content_hash=values["content_hash"],
                )
            )
        out.append(rows)
    return out


def lengths(rng: random.Random, count: int, total: int) -> list[int]:
    """``count`` long-tailed conversation lengths summing to exactly ``total``."""
    raw = [rng.lognormvariate(0.0, LENGTH_SIGMA) for _ in range(count)]
    scale = total / sum(raw)
    sizes = [min(MAX_LENGTH, max(MIN_LENGTH, round(value * scale))) for value in raw]
    order = sorted(range(count), key=lambda i: -sizes[i])
    step = 0
    while (gap := total - sum(sizes)) != 0:  # spread the rounding over the longest ones
        index = order[step % count]
        if (gap > 0 and sizes[index] < MAX_LENGTH) or (gap < 0 and sizes[index] > MIN_LENGTH):
            sizes[index] += 1 if gap > 0 else -1
        step += 1
    return sizes


@dataclass
class Plan:
    """One synthetic conversation's state: when it was last active, what ran on it."""

    cid: str
    length: int
    last_activity: datetime
    swept: bool
    dirty: bool = False
    last_compacted: datetime | None = None
    lease_owner: str | None = None
    lease_expires: datetime | None = None


def plans(rng: random.Random, now: datetime, sizes: list[int]) -> list[Plan]:
    """Each conversation's idle time and reconcile state."""
    out: list[Plan] = []
    for index, size in enumerate(sizes):
        if rng.random() < ACTIVE_SHARE:
            idle = timedelta(minutes=rng.uniform(1, 55))
        else:
            idle = timedelta(hours=rng.uniform(1.5, 24 * 30))
        last = now - idle
        plan = Plan(
            f"large-{index:05d}",
            size,
            last,
            swept=idle > timedelta(days=1) and rng.random() < SWEPT_SHARE,
            last_compacted=last + timedelta(seconds=5),
        )
        draw = rng.random()
        for share, state in (
            (DIRTY_SHARE, "dirty"),
            (NEVER_RUN_SHARE, "never"),
            (ACTIVE_SINCE_SHARE, "since"),
            (DEAD_LEASE_SHARE, "dead"),
            (LIVE_LEASE_SHARE, "live"),
        ):
            if draw < share:
                _stale(plan, state, now)
                break
            draw -= share
        out.append(plan)
    return out


def _stale(plan: Plan, state: str, now: datetime) -> None:
    earlier = plan.last_activity - timedelta(minutes=3)
    if state == "dirty":
        plan.dirty, plan.last_compacted = True, earlier
    elif state == "never":
        plan.last_compacted = None
    elif state == "since":
        plan.last_compacted = earlier
    else:
        plan.lease_owner = f"worker-{plan.cid}"
        plan.lease_expires = now - timedelta(minutes=2) if state == "dead" else now + timedelta(1)
        plan.dirty, plan.last_compacted = True, earlier


def conversation_rows(
    plan: Plan, walk: Iterator[tuple[int, Source]], first_id: int, summary_id: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Messages, summaries and clearings of one conversation, ids from ``first_id`` on."""
    messages: list[tuple[Any, ...]] = []
    tool_ids: list[tuple[int, int]] = []  # (message id, tokens) of its results
    cutoffs: list[int] = []
    since_summary = 0
    start = plan.last_activity - timedelta(seconds=20 * plan.length)
    parent: int | None = None
    for position in range(plan.length):
        part, source = next(walk)
        if position and source.role == "system":  # one system prompt, at the start
            part, source = next(walk)
        mid = first_id + position
        suffix = f"_{plan.cid}_{part}"
        messages.append(
            (
                mid,
                plan.cid,
                parent,
                source.role,
                source.content,
                source.content_parts,
                source.tool_calls.replace(SUFFIX, suffix) if source.tool_calls else None,
                f"{source.tool_call_id}{suffix}" if source.tool_call_id else None,
                source.name,
                source.extra,
                source.tokens,
                source.encoding,
                None,
                None,
                source.content_hash,
                start + timedelta(seconds=20 * position),
            )
        )
        if source.role == "tool":
            tool_ids.append((mid, source.tokens))
        since_summary += source.tokens
        if since_summary >= SUMMARY_EVERY_TOKENS and position < plan.length - 20:
            cutoffs.append(mid)
            since_summary = 0
        parent = mid
    summaries = []
    previous: int | None = None
    for number, cutoff in enumerate(cutoffs):
        at = start + timedelta(seconds=20 * (cutoff - first_id) + 30)
        summaries.append(
            (
                plan.cid,
                cutoff,
                previous,
                SUMMARY_TEXT,
                SUMMARY_TOKENS,
                "o200k_base",
                MODEL,
                SUMMARY_TOKENS * 50,
                SUMMARY_TOKENS,
                1.0,
                at,
            )
        )
        previous = summary_id + number
    clearings = []
    first_cutoff = cutoffs[0] if cutoffs else 0
    last_cutoff = cutoffs[-1] if cutoffs else 0
    for mid, tokens in tool_ids:  # cleared under pressure before the first summary
        if mid <= first_cutoff and tokens > PLACEHOLDER_TOKENS:
            at = start + timedelta(seconds=20 * (mid - first_id) + 25)
            clearings.append((plan.cid, mid, "pressure", tokens - PLACEHOLDER_TOKENS, at))
    if plan.swept:  # a past idle sweep: everything after the last cutoff but the newest results
        kept = {mid for mid, _ in tool_ids[-IDLE_KEEP:]} if IDLE_KEEP else set()
        at = plan.last_activity + timedelta(hours=1, minutes=5)
        for mid, tokens in tool_ids:
            if mid > last_cutoff and mid not in kept and tokens > PLACEHOLDER_TOKENS:
                clearings.append((plan.cid, mid, "idle", tokens - PLACEHOLDER_TOKENS, at))
    return messages, summaries, clearings


def _walk(rows: list[list[Source]], start: int) -> Iterator[tuple[int, Source]]:
    """The shared conversations one after another from ``start`` on, forever, with the index of
    the pass through the source that each message comes from (it makes call ids unique)."""
    part = 0
    while True:
        source = rows[(start + part) % len(rows)]
        for row in source:
            yield part, row
        part += 1


def server_engine(database: str, **kwargs: Any) -> Engine:
    return create_engine(f"{SERVER_URL}/{database}", **kwargs)


def _admin() -> Engine:
    return server_engine("postgres", isolation_level="AUTOCOMMIT")


def complete(database: str) -> bool:
    """Whether ``database`` exists and its marker says this generator version filled it."""
    admin = _admin()
    try:
        with admin.connect() as connection:
            found = connection.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": database}
            ).first()
    finally:
        admin.dispose()
    if found is None:
        return False
    engine = server_engine(database)
    try:
        with engine.connect() as connection:
            marker = connection.execute(
                text("SELECT to_regclass(:table) IS NOT NULL"), {"table": MARKER_TABLE}
            ).scalar()
            if not marker:
                return False
            version = connection.execute(text(f"SELECT max(version) FROM {MARKER_TABLE}")).scalar()
            return bool(version == GENERATOR_VERSION)
    finally:
        engine.dispose()


def recreate(database: str) -> None:
    """Drop ``database`` (closing its connections) and create it empty."""
    admin = _admin()
    try:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
            connection.execute(text(f'CREATE DATABASE "{database}"'))
    finally:
        admin.dispose()


def drop(database: str) -> None:
    admin = _admin()
    try:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _mark(engine: Engine, conversations: int, messages: int, now: datetime) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(
                f"CREATE TABLE {MARKER_TABLE} (version integer NOT NULL, conversations integer "
                "NOT NULL, messages integer NOT NULL, generated_at timestamptz NOT NULL)"
            )
        )
        connection.execute(
            text(f"INSERT INTO {MARKER_TABLE} VALUES (:version, :conversations, :messages, :at)"),
            {
                "version": GENERATOR_VERSION,
                "conversations": conversations,
                "messages": messages,
                "at": now,
            },
        )


def generated_at(engine: Engine) -> datetime:
    """The moment the dataset was generated for: its idle times and leases count from it."""
    with engine.connect() as connection:
        moment = connection.execute(text(f"SELECT max(generated_at) FROM {MARKER_TABLE}")).scalar()
    assert isinstance(moment, datetime)
    return moment


def _import_session(engine: Engine) -> None:
    from recap.core import service
    from recap.core.settings import load_settings

    messages = long_conversation(load_all(), SESSION_MESSAGES)
    service.import_conversations(
        engine, [{"id": SESSION_ID, "messages": messages}], load_settings(), model=MODEL
    )


def build_large(log: Callable[[str], None]) -> None:
    """Fill ``LARGE_DATABASE`` from scratch: migrations, then ``COPY`` of every table."""
    from recap.core.storage.migrate import upgrade
    from recap.core.storage.models import utcnow

    started = time.perf_counter()
    recreate(LARGE_DATABASE)
    engine = server_engine(LARGE_DATABASE)
    try:
        upgrade(engine)
        now = utcnow().replace(microsecond=0)
        rng = random.Random(SEED)
        rows = sources()
        sizes = lengths(rng, CONVERSATIONS - 1, MESSAGES - SESSION_MESSAGES)
        conversation_plans = plans(rng, now, sizes)
        raw = engine.raw_connection()
        try:
            driver: Any = raw.driver_connection
            with driver.cursor() as cursor:
                cursor.execute("SET synchronous_commit = off")
                with cursor.copy(f"COPY conversations ({CONVERSATION_COLUMNS}) FROM STDIN") as copy:
                    for plan in conversation_plans:
                        created = plan.last_activity - timedelta(seconds=20 * plan.length + 60)
                        copy.write_row(
                            (
                                plan.cid,
                                MODEL,
                                None,
                                None,
                                created,
                                plan.last_activity,
                                plan.lease_owner,
                                plan.lease_expires,
                                plan.dirty,
                                plan.last_compacted,
                                None,
                                new_incarnation(),
                            )
                        )
                summaries: list[tuple[Any, ...]] = []
                clearings: list[tuple[Any, ...]] = []
                next_id = 1
                with cursor.copy(f"COPY messages ({MESSAGE_COLUMNS}) FROM STDIN") as copy:
                    for number, plan in enumerate(conversation_plans):
                        walk = _walk(rows, rng.randrange(len(rows)))
                        written, summed, cleared = conversation_rows(
                            plan, walk, next_id, len(summaries) + 1
                        )
                        for row in written:
                            copy.write_row(row)
                        summaries += summed
                        clearings += cleared
                        next_id += len(written)
                        if number % 2_000 == 1_999:
                            log(f"{next_id - 1:,} messages written")
                with cursor.copy(f"COPY summaries ({SUMMARY_COLUMNS}) FROM STDIN") as copy:
                    for row in summaries:
                        copy.write_row(row)
                with cursor.copy(f"COPY clearings ({CLEARING_COLUMNS}) FROM STDIN") as copy:
                    for row in clearings:
                        copy.write_row(row)
                for table in ("messages", "summaries", "clearings"):
                    cursor.execute(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"(SELECT max(id) FROM {table}))"
                    )
            driver.commit()
        finally:
            raw.close()
        log(f"{len(summaries):,} summaries, {len(clearings):,} clearings written")
        _import_session(engine)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM ANALYZE"))
        with engine.connect() as connection:
            counted = connection.execute(
                text("SELECT (SELECT count(*) FROM conversations), (SELECT count(*) FROM messages)")
            ).one()
        if tuple(counted) != (CONVERSATIONS, MESSAGES):
            raise RuntimeError(f"generated {tuple(counted)}, expected {CONVERSATIONS, MESSAGES}")
        _mark(engine, CONVERSATIONS, MESSAGES, now)
    finally:
        engine.dispose()
    log(f"{LARGE_DATABASE} built in {time.perf_counter() - started:.0f} s")


def build_small(log: Callable[[str], None]) -> None:
    """``SMALL_DATABASE``: the schema and the 5,000-message conversation alone."""
    from recap.core.storage.migrate import upgrade
    from recap.core.storage.models import utcnow

    recreate(SMALL_DATABASE)
    engine = server_engine(SMALL_DATABASE)
    try:
        upgrade(engine)
        _import_session(engine)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM ANALYZE"))
        _mark(engine, 1, SESSION_MESSAGES, utcnow())
    finally:
        engine.dispose()
    log(f"{SMALL_DATABASE} built")


def ensure(rebuild: bool, log: Callable[[str], None]) -> None:
    """Both databases, complete and migrated to the newest revision; built only when needed."""
    from recap.core.storage.migrate import upgrade

    for database, build in ((LARGE_DATABASE, build_large), (SMALL_DATABASE, build_small)):
        if rebuild or not complete(database):
            build(log)
        else:
            engine = server_engine(database)
            try:
                upgrade(engine)  # a revision added since the build runs on the kept data
            finally:
                engine.dispose()


# --- the figures -------------------------------------------------------------------------------


def _wall(func: Callable[[], Any]) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def reconcile_figure(engine: Engine, now: datetime) -> Figure:
    from recap.workers.reconcile import candidates

    found = candidates(engine, now)
    ids = [cid for cid, _ in found]
    floor = text(
        "SELECT id, dirty FROM conversations WHERE id = ANY(:ids) ORDER BY last_activity_at"
    )

    def by_key() -> list[Any]:
        with engine.connect() as connection:
            return list(connection.execute(floor, {"ids": ids}))

    if sorted(tuple(row) for row in by_key()) != sorted(found):
        raise RuntimeError("the primary-key read returned other candidates than reconcile")
    passes, scans = [], []
    for _ in range(RECONCILE_RUNS):
        passes.append(_wall(lambda: candidates(engine, now)))
        scans.append(_wall(by_key))
    return Figure(
        "reconcile_pass_vs_index_scan",
        round(statistics.median(passes) / statistics.median(scans), 2),
        "<= 3",
        f"reconcile's candidate query ({len(found)} stale conversations of {CONVERSATIONS:,}, "
        f"{MESSAGES:,} messages, PostgreSQL) over one primary-key SELECT of the same "
        f"candidates, medians of {RECONCILE_RUNS} interleaved runs each",
    )


def sweep_figure(engine: Engine, now: datetime) -> Figure:
    from recap.core.settings import load_settings
    from recap.core.storage.sweep import sweep_idle

    settings = load_settings()
    with engine.connect() as connection:
        mark = int(connection.execute(text("SELECT coalesce(max(id), 0) FROM clearings")).one()[0])
    raw_insert = text(
        "INSERT INTO clearings (conversation_id, message_id, reason, tokens_reclaimed, "
        "created_at) SELECT m.conversation_id, m.id, 'idle', m.tokens - 60, :now "
        "FROM messages m JOIN bench_swept s ON s.id = m.id"
    )

    def reset() -> None:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("DELETE FROM clearings WHERE id > :mark"), {"mark": mark})
            connection.execute(text("VACUUM ANALYZE clearings"))

    def raw() -> None:
        with engine.begin() as connection:
            connection.execute(raw_insert, {"now": now})

    sweeps, raws, cleared = [], [], -1
    reset()  # what an interrupted earlier run may have left
    try:
        for _ in range(SWEEP_RUNS):
            started = time.perf_counter()
            result = sweep_idle(engine, settings, now=now)
            sweeps.append(time.perf_counter() - started)
            if cleared not in (-1, result.cleared):
                raise RuntimeError(f"sweeps cleared {cleared} and then {result.cleared}")
            cleared = result.cleared
            with engine.begin() as connection:
                connection.execute(text("DROP TABLE IF EXISTS bench_swept"))
                connection.execute(
                    text(
                        "CREATE TABLE bench_swept AS SELECT message_id AS id FROM clearings "
                        "WHERE id > :mark"
                    ),
                    {"mark": mark},
                )
                connection.execute(text("ANALYZE bench_swept"))
            reset()
            raws.append(_wall(raw))
            reset()
    finally:
        reset()
        with engine.begin() as connection:
            connection.execute(text("DROP TABLE IF EXISTS bench_swept"))
    if cleared <= 0:
        raise RuntimeError("the sweep cleared nothing: the dataset has no idle results left")
    return Figure(
        "sweep_pass_vs_raw_update",
        round(min(sweeps) / min(raws), 2),
        "<= 3",
        f"the idle sweep (default settings, batches of {settings.sweep_batch_size:,}) over "
        f"{MESSAGES:,} messages on PostgreSQL, clearing {cleared:,} results, over one raw "
        f"INSERT ... SELECT of the same clearing rows (best of {SWEEP_RUNS} each, interleaved; "
        f"{min(sweeps):.1f} s against {min(raws):.1f} s)",
    )


def assemble_figure(large: Engine, small: Engine) -> Figure:
    from recap.core import service
    from recap.core.settings import load_settings

    settings = load_settings()

    def assembled(engine: Engine) -> Callable[[], str]:
        def run() -> str:
            request = service.assemble(engine, SESSION_ID, settings)
            return json.dumps(request.as_dict(), ensure_ascii=False)

        return run

    logging.getLogger("recap.assemble").setLevel(logging.ERROR)  # one truncation line per run

    def messages(engine: Engine) -> Any:
        return service.assemble(engine, SESSION_ID, settings).as_dict()["messages"]

    if messages(large) != messages(small):  # the same request; only the message ids differ
        raise RuntimeError("the conversation assembles differently in the two databases")
    in_large, in_small = [], []
    for _ in range(ASSEMBLE_RUNS):
        in_large.append(_wall(assembled(large)))
        in_small.append(_wall(assembled(small)))
    return Figure(
        "assemble_large_db_vs_small",
        round(statistics.median(in_large) / statistics.median(in_small), 2),
        "<= 1.2",
        f"service.assemble of one {SESSION_MESSAGES:,}-message conversation to JSON in the "
        f"{MESSAGES:,}-message PostgreSQL database over the same in a database holding only it "
        f"(medians of {ASSEMBLE_RUNS} interleaved runs)",
    )


def _log(line: str) -> None:
    print(f"bench.large: {line}", file=sys.stderr, flush=True)


def settle(engine: Engine) -> None:
    """VACUUM ANALYZE, as autovacuum keeps a production table: the visibility map set (index-only
    scans need it; a vacuum that ran while some transaction was open may have left it unset) and
    the statistics current. Quick on a table that is already settled."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE"))


def run() -> list[Figure]:
    try:
        admin = _admin()
        with admin.connect():
            pass
        admin.dispose()
    except Exception:  # no server: nothing to measure here
        _log("PostgreSQL not reachable, its figures are left out")
        return []
    ensure(os.environ.get(REBUILD_SETTING, "") not in ("", "0"), _log)
    from recap.core.storage.db import make_engine

    large = make_engine(f"{SERVER_URL}/{LARGE_DATABASE}")
    small = make_engine(f"{SERVER_URL}/{SMALL_DATABASE}")
    try:
        settle(large)
        settle(small)
        now = generated_at(large)
        return [
            reconcile_figure(large, now),
            sweep_figure(large, now),
            assemble_figure(large, small),
        ]
    finally:
        large.dispose()
        small.dispose()


def main(argv: list[str]) -> int:
    """``python -m bench.large [--rebuild | --drop]``: build (or rebuild, or drop) the data."""
    if argv == ["--drop"]:
        drop(LARGE_DATABASE)
        drop(SMALL_DATABASE)
        return 0
    if argv not in ([], ["--rebuild"]):
        print("usage: python -m bench.large [--rebuild | --drop]", file=sys.stderr)
        return 2
    ensure(argv == ["--rebuild"], _log)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
