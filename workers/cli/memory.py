"""``recap memory``: a user's memory from the command line (list, set, delete, export, the
user's switch, and an extraction now). See docs/memory.md."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from recap.workers.cli.common import emit, engine, settings, table
from recap.workers.cli.errors import fail, handles_errors
from recap.workers.cli.options import MESSAGE_ID, JsonFlag

memory_app = typer.Typer(
    help="A user's memory: what Recap keeps about them across conversations.",
    no_args_is_help=True,
)
User = Annotated[str, typer.Argument(help="The user id (as the host or `recap serve` names it).")]
Key = Annotated[str, typer.Argument(help="The entry's key (a-z, 0-9, '_', '.', '-').")]


@memory_app.command("list")
@handles_errors
def list_(user: User, as_json: JsonFlag = False) -> None:
    """The user's entries, newest first, with the conversation and message that wrote each."""
    from recap.core.service import memories

    found = memories.list_memories(engine(), user)
    on = memories.is_enabled(engine(), user)
    payload = {"user_id": user, "enabled": on, "memories": [m.as_dict() for m in found]}
    rows = [
        [m.key, m.text[:60], m.tokens, m.uses, f"{m.conversation_id or '-'}#{m.message_id or '-'}"]
        for m in found
    ]

    def human() -> None:
        table(f"memory of {user}", ["key", "text", "tokens", "uses", "written by"], rows)
        typer.echo(f"{sum(m.tokens for m in found)} tokens; memory {'on' if on else 'off'}")

    emit(payload, as_json, human)


@memory_app.command("set")
@handles_errors
def set_(
    user: User, key: Key, text: Annotated[str, typer.Argument()], as_json: JsonFlag = False
) -> None:
    """Set one entry (within RECAP_MEMORY_MAX_TOKENS for the user)."""
    from recap.core.service import memories

    done = memories.set_memory(engine(), user, key, text, cap=settings().memory_max_tokens)
    emit(
        done.as_dict(),
        as_json,
        lambda: typer.echo(f"{user}: {done.key} set ({done.tokens} tokens)"),
    )


@memory_app.command("delete")
@handles_errors
def delete(
    user: User,
    key: Annotated[str | None, typer.Argument(help="The entry's key; none: all of them.")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm deleting all of them.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Delete one entry, or with --yes and no key, the user's whole memory and switch."""
    if key is None and not yes:
        fail(f"recap memory delete without a key removes all of {user!r}'s memory; add --yes")
    from recap.core.service import memories

    gone = memories.delete_memory(engine(), user, key)
    payload = {"user_id": user, "key": key, "deleted": gone}
    emit(payload, as_json, lambda: typer.echo(f"{user}: {gone} entries deleted"))


@memory_app.command("export")
@handles_errors
def export(user: User, as_json: JsonFlag = False) -> None:
    """Everything kept about the user, as one JSON object (always JSON)."""
    from recap.core.memory.export import export_user

    typer.echo(json.dumps(export_user(engine(), user), ensure_ascii=False))


@memory_app.command("off")
@handles_errors
def off(user: User, as_json: JsonFlag = False) -> None:
    """The user's switch off: nothing extracted from their conversations, nothing injected."""
    _switch(user, False, as_json)


@memory_app.command("on")
@handles_errors
def on(user: User, as_json: JsonFlag = False) -> None:
    """The user's switch on again (as RECAP_MEMORY allows)."""
    _switch(user, True, as_json)


def _switch(user: str, value: bool, as_json: bool) -> None:
    from recap.core.service import memories

    memories.set_enabled(engine(), user, value)
    state = "on" if value else "off"
    emit(
        {"user_id": user, "enabled": value}, as_json, lambda: typer.echo(f"{user}: memory {state}")
    )


@memory_app.command("extract")
@handles_errors
def extract(
    user: User,
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    leaf: Annotated[int | None, typer.Option(help="The turn's last message.", **MESSAGE_ID)] = None,
    as_json: JsonFlag = False,
) -> None:
    """Extract the user's memory from the conversation's turn now, in this process."""
    from recap.core.memory.run import extract_now
    from recap.core.service import conversation_exists

    if not conversation_exists(engine(), conversation):
        fail(f"unknown conversation {conversation!r}")
    result = extract_now(engine(), settings(), user, conversation, leaf)
    emit(result, as_json, lambda: typer.echo(f"{result['action']}: {result['reason']}"))
    if result["action"] == "failed":
        raise typer.Exit(1)
