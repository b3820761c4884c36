"""Request assembly, the host's hot path: a 5,000-message conversation assembled from SQLite.

Three timings of the same request, in the same process:
(a) ``service.assemble`` from the database to the final JSON string;
(b) the floor: a plain SQL select of the same rows plus ``json.dumps`` of (a)'s own output;
(c) what a host without Recap does per request: count every message with ``litellm.token_counter``.

And what recording the request profile adds to (a) when the host passes its fixed parts (a system
prompt and tool schemas): ``service.recording._record_profile`` timed alone, once with the profile
already stored (the common case: a hash and a compare, no write) and once with a profile that
changes every request (the upsert each time), over the whole ``service.assemble`` with the same
parts.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import Figure, best_of_each
from bench.data import load_all

MODEL = "gpt-4o-mini"
MESSAGES = 5_000
CONVERSATION_ID = "bench-5000"
REPEATS = 15  # best of fifteen: the least disturbed run of each side
NAIVE_REPEATS = 3  # the naive side takes about a second a run
ASSEMBLE_PER_NAIVE = 5  # assembly runs between naive ones: its best needs more tries
ALL_FIT_WINDOW = 10_000_000  # a window the whole conversation fits in: every message rendered
SELECT_ROWS = (
    "SELECT id, parent_id, role, content, tokens, tool_calls, tool_call_id, name, content_parts, "
    "extra, output_path, original_bytes FROM messages WHERE conversation_id = ?"
)


def long_conversation(records: list[dict[str, Any]], size: int = MESSAGES) -> list[dict[str, Any]]:
    """``size`` messages: the shared conversations one after another, as one long session.

    Only the first system prompt is kept, and call ids get the source's index so that they stay
    unique across the whole session.
    """
    out: list[dict[str, Any]] = []
    for index, record in enumerate(records):
        for message in record["messages"]:
            if message["role"] == "system" and out:
                continue
            copy = dict(message)
            if copy.get("tool_calls"):
                copy["tool_calls"] = [
                    {**call, "id": f"{call['id']}_{index}"} for call in copy["tool_calls"]
                ]
            if copy.get("tool_call_id"):
                copy["tool_call_id"] = f"{copy['tool_call_id']}_{index}"
            out.append(copy)
            if len(out) == size:
                return out
    raise ValueError(f"the shared data holds fewer than {size} messages")


def run() -> list[Figure]:
    from recap.core import service
    from recap.core.settings import load_settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade

    messages = long_conversation(load_all())
    settings = load_settings()
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'bench.db'}")
        upgrade(engine)
        service.import_conversations(
            engine, [{"id": CONVERSATION_ID, "messages": messages}], settings, model=MODEL
        )

        def assembled(window: int | None = None) -> str:
            request = service.assemble(engine, CONVERSATION_ID, settings, max_input_tokens=window)
            return json.dumps(request.as_dict(), ensure_ascii=False)

        def floor(payload: dict[str, Any]) -> Callable[[], str]:
            def select_and_dump() -> str:
                with engine.connect() as connection:
                    connection.exec_driver_sql(SELECT_ROWS, (CONVERSATION_ID,)).fetchall()
                return json.dumps(payload, ensure_ascii=False)

            return select_and_dump

        figures = [
            *_serialize_figures(assembled, floor),
            *_profile_figures(engine, settings, messages),
            _naive_figure(messages, assembled),
            _peak_figure(assembled),
        ]
        engine.dispose()
    return figures


def _serialize_figures(
    assembled: Callable[..., str], floor: Callable[[dict[str, Any]], Callable[[], str]]
) -> list[Figure]:
    figures = []
    for window, name, what, bound in (
        (None, "assemble_vs_serialize", f"at {MODEL}'s own window", "<= 3"),
        (ALL_FIT_WINDOW, "assemble_vs_serialize_all_fit", "with a window all of it fits in", ""),
    ):
        payload = json.loads(assembled(window))

        def ours_run(w: int | None = window) -> str:
            return assembled(w)

        ours, baseline = best_of_each([ours_run, floor(payload)], REPEATS)
        figures.append(
            Figure(
                name,
                round(ours / baseline, 2),
                bound,
                f"service.assemble of a {MESSAGES}-message conversation from SQLite to its JSON "
                f"({len(payload['messages'])} messages sent, {what}), against a plain SQL select "
                "of the same rows plus json.dumps of that output",
            )
        )
    return figures


def _profile_figures(engine: Any, settings: Any, messages: list[dict[str, Any]]) -> list[Figure]:
    from datetime import UTC, datetime

    from recap.core import service
    from recap.core.request import assembly
    from recap.core.service import recording as service_recording
    from recap.core.storage import profile as profiles
    from recap.core.storage import reads
    from recap.core.storage.db import session_scope
    from recap.core.values.request import RequestSpec
    from recap.workers.replay import host_parts

    parts = host_parts({"messages": messages})
    system, tools = parts.system, parts.tools
    reminders = iter(f"Reminder {n}: stay on the task." for n in range(10**9))

    def assembled() -> None:
        service.assemble(engine, CONVERSATION_ID, settings, system=system, tools=tools)

    request = service.assemble(engine, CONVERSATION_ID, settings, system=system, tools=tools)
    with session_scope(engine) as session:
        built = (MODEL, reads.load_request_branch(session, CONVERSATION_ID, None, None), request)

    def recorded(reminder: str | None) -> Callable[[], None]:
        def record() -> None:
            with session_scope(engine) as session:  # what assemble has read by then
                stored = profiles.load_profile(session.connection(), CONVERSATION_ID)
            given = RequestSpec(system=system, tools=tools, reminder=reminder)
            fixed = profiles.FixedParts(*assembly.fixed_part_tokens([], given, model=MODEL))
            started = time.process_time()
            service_recording._record_profile(
                engine, CONVERSATION_ID, fixed, stored, given, datetime.now(UTC), built
            )
            spent.append(time.process_time() - started)

        return record

    assembled()  # the profile of these parts is stored now
    whole = min(best_of_each([assembled], REPEATS))
    figures = []
    for name, reminder, what in (
        ("profile_record_share", None, "the profile already stored (no write)"),
        ("profile_upsert_share", "changes", "a profile that changes every request (one upsert)"),
    ):
        spent: list[float] = []
        for _ in range(REPEATS):
            recorded(next(reminders) if reminder else None)()
        figures.append(
            Figure(
                name,
                round(min(spent) / whole, 3),
                "<= 0.10",
                f"recording the request profile ({what}) over the whole service.assemble of the "
                f"{MESSAGES}-message conversation with a system prompt and {len(tools)} tool "
                "schemas, CPU time, best of each",
            )
        )
    return figures


def _naive_figure(messages: list[dict[str, Any]], assembled: Callable[..., str]) -> Figure:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    def naive() -> None:
        for message in messages:
            litellm.token_counter(model=MODEL, messages=[message])

    litellm.token_counter(model=MODEL, messages=messages[:10])  # load its encodings first
    theirs, *ours_runs = best_of_each([naive, *[assembled] * ASSEMBLE_PER_NAIVE], NAIVE_REPEATS)
    ours = min(ours_runs)
    return Figure(
        "assemble_vs_naive",
        round(theirs / ours, 1),
        ">= 20",
        f"litellm.token_counter over each of the {MESSAGES} messages (what a host without "
        "stored counts does per request) divided by the whole service.assemble to JSON",
    )


def _peak_figure(assembled: Callable[..., str]) -> Figure:
    tracemalloc.start()
    assembled()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return Figure(
        "assemble_peak_mib",
        round(peak / 2**20, 1),
        "",
        "peak Python memory (tracemalloc) of one service.assemble to JSON of that conversation",
    )
