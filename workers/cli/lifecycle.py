"""The commands over a conversation's life: ``pin`` (keep a message verbatim), ``delete``,
``conversations`` (the list, one page at a time) and ``expire`` (delete the idle ones)."""

from __future__ import annotations

from typing import Annotated

import typer

from recap.workers.cli.common import emit, engine, settings, table
from recap.workers.cli.errors import fail, handles_errors
from recap.workers.cli.options import MAX_DAYS, MESSAGE_ID, JsonFlag, finite

IdleDays = Annotated[
    float | None,
    typer.Option(
        "--idle-days",
        help="Only conversations idle longer than this many days.",
        parser=finite(0, MAX_DAYS, open_low=False),
    ),
]


@handles_errors
def pin(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    message_id: Annotated[
        int, typer.Argument(help="The message's id (as `recap export` shows it).", **MESSAGE_ID)
    ],
    off: Annotated[bool, typer.Option("--off", help="Unpin the message instead.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Send a message verbatim in every request of its branch, whatever is summarized (--off:
    unpin it)."""
    from recap.core import lifecycle

    change = lifecycle.unpin if off else lifecycle.pin
    done = change(engine(), conversation, message_id, settings())
    payload = done.as_dict()
    state = "pinned" if done.pinned else "not pinned"
    news = "" if done.changed else " (already)"
    emit(
        payload,
        as_json,
        lambda: typer.echo(
            f"message {message_id} of {conversation}: {state}{news}; "
            f"{done.pinned_tokens} of {done.max_pinned_tokens} pinned tokens in use"
        ),
    )


@handles_errors
def delete(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: this cannot be undone.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Delete a conversation and everything derived from it (rows and saved files)."""
    if not yes:
        fail(f"recap delete removes conversation {conversation!r} for good; add --yes to confirm")
    from recap.core import lifecycle

    payload = lifecycle.delete(engine(), conversation, settings()).as_dict()
    rows = payload.pop("rows")
    emit(
        {**payload, "rows": rows},
        as_json,
        lambda: typer.echo(
            f"deleted {conversation}: {payload['messages']} messages, "
            f"{sum(rows.values())} rows, {payload['files']} files ({payload['bytes']} bytes)"
        ),
    )


@handles_errors
def conversations(
    idle_days: IdleDays = None,
    after: Annotated[
        str | None, typer.Option(help="Start after this conversation id (the previous `next`).")
    ] = None,
    limit: Annotated[int, typer.Option(help="Conversations per page.", min=1, max=1_000)] = 50,
    as_json: JsonFlag = False,
) -> None:
    """List conversations (id order, one page): messages, tokens, last activity, pressure."""
    from recap.core import lifecycle

    rows, following = lifecycle.conversations(
        engine(), settings(), idle_days=idle_days, after=after, limit=limit
    )
    listed = [row.as_dict() for row in rows]
    columns = ["id", "messages", "tokens", "last_activity_at", "pressure"]

    def human() -> None:
        table("conversations", columns, [[r[c] for c in columns] for r in listed])
        if following is not None:
            typer.echo(f"more: recap conversations --after {following}")

    emit({"conversations": listed, "next": following}, as_json, human)


@handles_errors
def expire(
    retention_days: Annotated[
        float | None,
        typer.Option(
            help="Days of idleness (default: RECAP_CONVERSATION_RETENTION_DAYS).",
            parser=finite(0, MAX_DAYS, open_low=True),
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: this cannot be undone.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Delete the conversations idle longer than the retention now (the beat task's work)."""
    from recap.core import lifecycle

    current = settings()
    if retention_days is None and current.conversation_retention_days is None:
        fail("no retention: set RECAP_CONVERSATION_RETENTION_DAYS or give --retention-days")
    if not yes:
        fail("recap expire deletes idle conversations for good; add --yes to confirm")
    total = {"deleted": 0, "messages": 0, "files": 0, "bytes": 0}
    while True:
        done = lifecycle.expire(engine(), current, retention_days=retention_days)
        for key in total:
            total[key] += done.as_dict()[key]
        if not done.more or not done.conversations:
            break
    emit(total, as_json, lambda: table("expire", list(total), [list(total.values())]))


@handles_errors
def attach(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    source: Annotated[str, typer.Option("--source", help="The conversation to attach.")],
    leaf: Annotated[
        int | None,
        typer.Option(
            "--leaf",
            help="The source's message its branch ends at (default: its latest).",
            **MESSAGE_ID,
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Attach another conversation's branch after this one's head: later requests carry its
    messages there, between markers, once."""
    from recap.core import service

    done = service.attach(engine(), conversation, source, leaf=leaf)
    emit(
        done.as_dict(),
        as_json,
        lambda: typer.echo(
            f"{source} (up to message {done.leaf}) attached to {conversation}: "
            f"markers {done.open_id} and {done.close_id}"
        ),
    )


@handles_errors
def merge(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    peers: Annotated[
        list[str],
        typer.Option(
            "--peer",
            help="A branch head's message id or a conversation id (repeat; first: the base).",
        ),
    ],
    instruction: Annotated[
        str, typer.Option("--instruction", help="What the model is asked to do with the peers.")
    ],
    leaf: Annotated[
        int | None,
        typer.Option(
            "--leaf",
            help="The head of the branch to merge into (default: the latest).",
            **MESSAGE_ID,
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Merge peer branches into this one: attach each, then the instruction, and print the
    request to send; adding its reply (`recap add CONV --role assistant`) commits the merge."""
    from recap.core import service
    from recap.core.values.request import RequestSpec

    given = [int(p) if p.isdigit() else p for p in peers]
    done = service.merge(
        engine(),
        conversation,
        settings(),
        RequestSpec(),
        peers=given,
        instruction=instruction,
        leaf=leaf,
    )
    emit(
        done.as_dict(),
        as_json,
        lambda: typer.echo(
            f"merge {done.merge_id} opened in {conversation}: instruction {done.instruction_id}, "
            f"parents {', '.join(map(str, done.parents))}; the request has "
            f"{len(done.request.messages) if done.request else 0} messages "
            f"({done.request.tokens.total if done.request else 0} tokens)"
        ),
    )
