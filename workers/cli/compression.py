"""The commands around compression runs: ``compress`` (one run now, or sent to the workers),
``reconcile`` (re-send runs that went missing), ``failures`` (recent failed runs) and ``retry``
(send failed conversations again)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from recap.core.values.actions import Action
from recap.workers.cli.common import emit, engine, settings, table
from recap.workers.cli.durations import SinceOption, parse_duration
from recap.workers.cli.errors import fail, handles_errors, require_broker
from recap.workers.cli.options import JsonFlag, LeafOption


@handles_errors
def compress(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    leaf: LeafOption = None,
    force: Annotated[bool, typer.Option(help="Summarize even under the trigger.")] = False,
    enqueue: Annotated[bool, typer.Option(help="Send it to the workers instead.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run compress_session now, in this process (or --enqueue it for the workers)."""
    if enqueue:
        from recap.workers.app import app as celery_app
        from recap.workers.enqueue import CompressJob, send

        require_broker()
        task = send(celery_app, CompressJob(conversation, leaf, force))
        emit({"task_id": str(task.id)}, as_json, lambda: typer.echo(str(task.id)))
        return
    from recap.workers.compress import run_with_retries
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="WARNING")  # stdout keeps only the result
    payload = run_with_retries(engine(), settings(), conversation, leaf, force).as_dict()
    emit(payload, as_json, lambda: table("compress", list(payload), [list(payload.values())]))
    if payload["action"] == Action.FAILED:
        raise typer.Exit(1)


@handles_errors
def reconcile(as_json: JsonFlag = False) -> None:
    """Re-enqueue conversations over their trigger whose last run is missing or died."""
    from recap.workers.reconcile import reconcile as reconcile_pass
    from recap.workers.tasks import enqueue

    require_broker()  # before the pass marks anything checked
    payload = reconcile_pass(engine(), settings(), enqueue)
    emit(payload, as_json, lambda: typer.echo(f"enqueued {payload['enqueued']}"))


def _failed_since(since: str, conversations: list[str] | None = None) -> list[Any]:
    """The failed runs not settled within ``since`` (a duration such as ``24h``)."""
    from recap.core.service import maintenance

    within = parse_duration(since)
    return maintenance.failed_runs(engine(), within=within, conversation_ids=conversations)


@handles_errors
def failures(since: SinceOption = "24h", as_json: JsonFlag = False) -> None:
    """Recent failed compressions not settled since: conversation, when, reason, attempts."""
    payload = {"failures": [run.as_dict() for run in _failed_since(since)]}
    columns = ["conversation_id", "at", "attempts", "reason"]

    def human() -> None:  # reads the payload after emit masked it
        rows = [[run[c] for c in columns] for run in payload["failures"]]
        table(f"failed in the last {since}", columns, rows)

    emit(payload, as_json, human)


@handles_errors
def retry(
    conversations: Annotated[
        list[str] | None, typer.Argument(help="Conversation ids to compress again.")
    ] = None,
    all_failed: Annotated[
        bool, typer.Option("--all-failed", help="Every conversation `recap failures` lists.")
    ] = False,
    since: Annotated[
        str | None, typer.Option("--since", help="With --all-failed: how far back (default 24h).")
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Run now, past a failure cooldown and the trigger (default).")
    ] = True,
    as_json: JsonFlag = False,
) -> None:
    """Enqueue compress_session again for failed conversations, on the configured broker."""
    from recap.core.errors import InputError

    if bool(conversations) == all_failed:
        raise InputError("give conversation ids or --all-failed (one of the two)")
    if since is not None and not all_failed:
        raise InputError("--since applies to --all-failed only")
    targets = (
        [run.conversation_id for run in _failed_since(since or "24h")]
        if all_failed
        else _existing(list(dict.fromkeys(conversations or ())))
    )
    task_ids = _enqueue_all(targets, force=force)
    payload = {"enqueued": len(task_ids), "task_ids": task_ids, "conversations": targets}
    emit(payload, as_json, lambda: typer.echo(f"enqueued {len(task_ids)}"))


def _existing(conversations: list[str]) -> list[str]:
    """The ids, after checking each names a stored conversation (``NotFoundError`` if not)."""
    from recap.core.service import maintenance

    maintenance.require_conversations(engine(), conversations)
    return conversations


def _enqueue_all(conversations: list[str], *, force: bool) -> list[str]:
    """Send one task per conversation; an unreachable broker is one line, not a traceback."""
    from kombu.exceptions import OperationalError

    from recap.workers.tasks import enqueue

    try:
        return [enqueue(conversation, force=force) for conversation in conversations]
    except OperationalError as exc:
        fail(f"cannot reach the broker: {exc}")
        raise AssertionError("unreachable") from None
