"""The commands that run Recap itself: ``replay`` (logs through the real pipeline), ``demo`` (the
whole pipeline on an embedded conversation), ``worker`` (the Celery workers), ``serve`` (the
OpenAI and Anthropic APIs) and ``ui`` (the web console)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recap.workers.cli.common import emit, settings, table
from recap.workers.cli.errors import fail, handles_errors
from recap.workers.cli.options import WINDOW, JsonFlag


@handles_errors
def replay(
    file: Annotated[Path, typer.Argument(help="Conversations in the import format (JSON lines).")],
    window: Annotated[
        int | None, typer.Option(help="Window to replay at (default: the model's).", **WINDOW)
    ] = None,
    idle_gap: Annotated[
        bool, typer.Option("--idle-gap", help="Insert one idle gap at each run's middle step.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Replay logs through the real pipeline and report what Recap would have done."""
    from recap.workers import replay as replaying

    report = replaying.run(file, settings(), window=window, idle_gap=idle_gap)
    total = report["total"]
    emit(
        report,
        as_json,
        lambda: table(
            f"replay of {file.name}",
            [
                "conversation",
                "requests",
                "peak",
                "window",
                "overflows without",
                "summaries",
                "silent truncations",
                "cost vs no clearing",
                "cost vs last-3",
            ],
            [
                [
                    c["id"][-28:],
                    c["requests"],
                    c["peak_tokens"],
                    c["window"],
                    c["overflows_without"],
                    c["summaries"],
                    c["silent_truncations"],
                    c["cost_vs_no_clearing"],
                    c["cost_vs_sliding"],
                ]
                for c in report["conversations"]
            ]
            + [
                [
                    "total",
                    total["requests"],
                    total["peak_tokens"],
                    "",
                    total["overflows_without"],
                    total["summaries"],
                    total["silent_truncations"],
                    total["cost_vs_no_clearing"],
                    total["cost_vs_sliding"],
                ]
            ],
        ),
    )


@handles_errors
def demo(
    window: Annotated[
        int, typer.Option(help="Window of the demo conversation (tokens).", **WINDOW)
    ] = 6_000,
    chart: Annotated[Path, typer.Option(help="Where to write the PNG chart.")] = Path(
        ".recap/demo.png"
    ),
) -> None:
    """Run the whole pipeline end to end on the embedded default, with a result table."""
    from rich.console import Console
    from rich.progress import Progress

    from recap.workers import demo as demo_run
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="WARNING")
    console = Console()
    console.print(
        "Replaying a real support-agent conversation (tau-bench airline, MIT) through SQLite, "
        "the file broker, a Celery worker in this process and the "
        f"{settings().summary_model or 'offline extractive'} summarizer; window {window:,} tokens."
    )
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("turns", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        rows = demo_run.run(window=window, progress=advance)
    table(
        "request tokens per turn",
        ["turn", "messages", "without Recap", "with Recap", "action"],
        [
            [
                r.turn,
                r.messages,
                f"{r.without:,}" + (" (over window)" if r.without > window else ""),
                f"{r.with_recap:,}" + (f" ({r.left_out} left out)" if r.left_out else ""),
                r.action,
            ]
            for r in rows
        ],
    )
    if demo_run.write_chart(rows, window, chart):
        console.print(f"chart written to {chart}")
    else:
        console.print("no chart: matplotlib is not installed (pip install 'recap[plot]')")


@handles_errors
def worker(
    ctx: typer.Context,
    queues: Annotated[
        str,
        typer.Option(
            help="compress, maintenance, or both (two worker processes); memory alone starts a "
            "worker for the memory queue (the compress worker consumes it too)."
        ),
    ] = "compress,maintenance",
    beat: Annotated[bool, typer.Option(help="Embed beat (single-machine setups).")] = False,
) -> None:
    """Start workers: threads for `compress`, a small pool for `maintenance`. Other Celery
    worker arguments are passed through (for example --concurrency 32)."""
    from recap.workers import runner

    settings()  # an invalid setting stops here, in one line
    names = [q.strip() for q in queues.split(",") if q.strip()]
    if sorted(names) == ["compress", "maintenance"]:
        raise typer.Exit(runner.run_both(beat=beat, extra=ctx.args))
    if len(names) != 1:
        fail("--queues takes compress, maintenance, or compress,maintenance")
    raise typer.Exit(runner.run_one(names[0], beat=beat, extra=ctx.args))


@handles_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65_535)] = 8400,
) -> None:
    """Serve OpenAI's chat-completions and Responses APIs and Anthropic's Messages API over
    Recap (clients authenticate with a key from RECAP_SERVE_KEYS; see docs/serve-apis.md)."""
    settings()  # an invalid setting stops here, in one line (before the server's imports)
    from recap.workers.serve.app import serve as run_server

    run_server(host, port)


@handles_errors
def ui(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65_535)] = 8401,
) -> None:
    """Serve the web console at /ui (log in with a key of RECAP_UI_KEYS; docs/console.md)."""
    settings()  # an invalid setting stops here, in one line; a missing console key in run_console
    from recap.workers.ui.app import serve as run_console

    run_console(host, port)
