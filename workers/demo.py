"""``recap demo``: the whole pipeline on the embedded default, end to end, in under a minute.

SQLite, the file broker, a real Celery worker started in this process, and the summarizer the
settings name (the offline extractive one by default). A bundled real support-agent conversation
is replayed turn by turn; after each turn ``recap.compress_session`` is enqueued and its result
awaited, and the request the host would send is measured with and without Recap.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recap.core.storage.private import make_folder
from recap.core.values.actions import ACTED, Action

DEMO_FILE = Path(__file__).parent / "data" / "demo.jsonl"
DEMO_DIR = Path(".recap") / "demo"
DEMO_WINDOW = 6_000  # small enough that this 62-message conversation must be compressed
RESULT_TIMEOUT = 60  # seconds to wait for one compress_session result
WORKER_THREADS = 4
POLL_SECONDS = 0.05  # how often the file broker and the result files are looked at (not 1 s)


@dataclass(frozen=True, kw_only=True)
class TurnRow:
    """One turn of the replay: what the next request costs with and without Recap."""

    turn: int
    messages: int
    without: int
    with_recap: int
    action: str
    reason: str
    left_out: int = 0  # messages the request with Recap left out to fit (reported, not silent)


def demo_environment(folder: Path) -> dict[str, str]:
    """Settings for an isolated run: its own database, broker folder, results and outputs."""
    folder = folder.resolve()
    return {
        "RECAP_DATABASE_URL": f"sqlite:///{folder / 'recap.db'}",
        "RECAP_BROKER_URL": "filesystem://",
        "RECAP_BROKER_FOLDER": str(folder / "broker"),
        "RECAP_RESULT_BACKEND": f"file://{folder / 'results'}",
        "RECAP_OUTPUT_DIR": str(folder / "outputs"),
        "RECAP_LOG_JSON": "false",
        "RECAP_LOG_LEVEL": "WARNING",
    }


def turns_of(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Messages grouped into turns: each user message starts one (leading system messages join
    the first)."""
    turns: list[list[dict[str, Any]]] = [[]]
    for message in messages:
        if message["role"] == "user" and any(m["role"] == "user" for m in turns[-1]):
            turns.append([])
        turns[-1].append(message)
    return turns


@contextmanager
def running_worker(app: Any) -> Iterator[None]:
    """A real worker in a thread of this process, serving both queues."""
    from celery.contrib.testing.worker import start_worker

    with start_worker(
        app,
        pool="threads",
        concurrency=WORKER_THREADS,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=10,
        queues=["compress", "maintenance"],
    ):
        yield


def run(window: int = DEMO_WINDOW, folder: Path = DEMO_DIR, progress: Any = None) -> list[TurnRow]:
    """Replay the bundled conversation through the pipeline; one row per turn."""
    if folder.exists():
        shutil.rmtree(folder)
    make_folder(folder / "results")
    os.environ.update(demo_environment(folder))

    from recap.core import service
    from recap.core.counting import tokens
    from recap.core.settings import get_settings
    from recap.core.storage.db import get_engine
    from recap.core.storage.migrate import upgrade

    get_settings.cache_clear()
    settings = get_settings()
    from recap.workers.app import app, configure
    from recap.workers.enqueue import CompressJob, send

    configure(app, settings)
    options = {**app.conf.broker_transport_options, "polling_interval": POLL_SECONDS}
    app.conf.broker_transport_options = options  # the file broker looks for messages this often
    import recap.workers.maintenance
    import recap.workers.tasks  # noqa: F401  (registers the compression tasks)

    engine = get_engine(settings.database_url)
    upgrade(engine)
    record = json.loads(DEMO_FILE.read_text(encoding="utf-8").splitlines()[0])
    cid = service.new_conversation(engine, settings, None, max_input_tokens=window)
    encoding = tokens.encoding_name_for(settings.default_model)
    turns = turns_of(record["messages"])
    rows: list[TurnRow] = []
    naive: list[dict[str, Any]] = []
    with running_worker(app):
        for number, turn in enumerate(turns, start=1):
            for message in turn:
                service.add_message(engine, cid, message)
                naive.append(message)
            request = service.assemble(engine, cid, settings)
            result = send(app, CompressJob(cid))
            outcome = result.get(timeout=RESULT_TIMEOUT, propagate=False, interval=POLL_SECONDS)
            outcome = (
                outcome
                if isinstance(outcome, dict)
                else {"action": Action.FAILED, "reason": str(outcome)}
            )
            rows.append(
                TurnRow(
                    turn=number,
                    messages=len(naive),
                    without=tokens.count_messages(naive, encoding),
                    with_recap=request.tokens.total,
                    action=str(outcome.get("action")),
                    reason=str(outcome.get("reason", "")),
                    left_out=len(request.dropped_message_ids) if request.truncated else 0,
                )
            )
            if progress is not None:
                progress(number, len(turns))
    engine.dispose()
    return rows


def write_chart(rows: list[TurnRow], window: int, path: Path) -> bool:
    """A PNG of request tokens per turn with and without Recap; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    turns = [r.turn for r in rows]
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=120)
    axes.plot(turns, [r.without for r in rows], marker="o", label="without Recap")
    axes.plot(turns, [r.with_recap for r in rows], marker="o", label="with Recap")
    axes.axhline(window, color="grey", linestyle="--", label=f"window ({window:,} tokens)")
    for row in rows:
        if row.left_out:
            axes.annotate(
                f"{row.left_out} left out",
                (row.turn, row.with_recap),
                textcoords="offset points",
                xytext=(0, -14),
                ha="center",
                fontsize=8,
                color="firebrick",
            )
        if row.action in ACTED:
            axes.annotate(
                row.action,
                (row.turn, row.with_recap),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=8,
            )
    axes.set_xlabel("turn")
    axes.set_ylabel("request tokens")
    axes.set_title("Request size per turn (tau-bench airline conversation)")
    axes.legend()
    figure.tight_layout()
    make_folder(path.parent)
    figure.savefig(path)
    plt.close(figure)
    return True
