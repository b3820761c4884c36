"""The commands that show a conversation without changing it: ``assemble`` (the request the host
would send), ``stats`` (context pressure), ``summaries``, ``timeline`` (each message's state in
the request) and ``recall`` (the original a placeholder or summary names)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from recap.workers.cli.common import emit, engine, read_text, service, settings, table
from recap.workers.cli.errors import handles_errors
from recap.workers.cli.options import AsOfOption, JsonFlag, LeafOption, WindowOption


@handles_errors
def assemble(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    leaf: LeafOption = None,
    system: Annotated[
        str | None, typer.Option(help="System prompt (default: the stored one).")
    ] = None,
    reminder: Annotated[str | None, typer.Option(help="Reminder sent as the last message.")] = None,
    tools: Annotated[
        Path | None, typer.Option(help="JSON file with the tool schemas (a list, or {tools}).")
    ] = None,
    context_file: Annotated[
        list[Path] | None,
        typer.Option(help="File shown just before the last user message (repeatable)."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model the request is for.")] = None,
    max_input_tokens: WindowOption = None,
    text_only: Annotated[bool, typer.Option(help="Render tool turns as plain text.")] = False,
    cache: Annotated[
        bool | None,
        typer.Option(
            "--cache/--no-cache",
            help="Anthropic-style cache marks (the stable prefix and the newest messages); "
            "default: on for Anthropic models.",
        ),
    ] = None,
    as_of: AsOfOption = None,
    user: Annotated[
        str | None, typer.Option(help="The user whose memory the request carries.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Print the request the host would send now (or would have sent at --as-of TIME)."""
    from recap.core.request.assembly import ContextFile

    files = [ContextFile(str(path), read_text(path)) for path in context_file or ()]
    request = service.assemble(
        engine(),
        conversation,
        settings(),
        leaf=leaf,
        system=system,
        tools=_read_tools(tools) if tools is not None else None,
        reminder=reminder,
        context_files=files,
        model=model,
        max_input_tokens=max_input_tokens,
        text_only=text_only,
        cache_breakpoints=cache,
        as_of=as_of,
        user_id=user,
    )
    payload = request.as_dict()
    rows = [
        [i, m["role"], str(m.get("content") or "")[:60].replace("\n", " ")]
        for i, m in enumerate(request.messages)
    ]

    def human() -> None:
        table(f"request for {conversation}", ["#", "role", "content"], rows)
        typer.echo(f"tokens {payload['tokens']} of budget {request.budget}")
        if request.truncated:
            typer.echo(
                f"truncated: {len(request.dropped_message_ids)} messages left out "
                f"({request.truncated_tokens} tokens); compress the conversation to keep them"
            )

    emit(payload, as_json, human, verbatim=True)


def _read_tools(path: Path) -> list[dict[str, Any]]:
    """Tool schemas from a JSON file: a list of objects, or an object with a ``tools`` list."""
    from recap.core.errors import InputError
    from recap.core.values.limits import loads

    data = loads(read_text(path), str(path))
    if isinstance(data, dict):
        data = data.get("tools")
    if not isinstance(data, list) or not all(isinstance(tool, dict) for tool in data):
        raise InputError(f"{path}: expected a list of tool schemas (JSON objects)")
    return data


@handles_errors
def stats(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    leaf: LeafOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Context pressure, without calling any model."""
    payload = service.conversation_stats(engine(), conversation, settings(), leaf).as_dict()
    rows = [[name, _figure(value)] for name, value in payload.items()]
    emit(
        payload,
        as_json,
        lambda: table(f"stats of {conversation}", ["figure", "value"], rows),
    )


def _figure(value: Any) -> str:
    """One value of a figure/value table: whole numbers with thousands separators, booleans as
    in the JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@handles_errors
def summaries(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    as_json: JsonFlag = False,
) -> None:
    """List the conversation's summaries, oldest first (with the provider's compaction of the
    same span, where a run got one: RECAP_PROVIDER_COMPACTION)."""
    rows = [row.as_dict() for row in service.list_summaries(engine(), conversation)]
    columns = [
        "id",
        "cutoff_message_id",
        "previous_summary_id",
        "tokens",
        "model",
        "identifier_retention",
        "created_at",
        "provider_compaction",
    ]
    emit(
        {"summaries": rows},
        as_json,
        lambda: table("summaries", columns, [[r[c] for c in columns] for r in rows]),
    )


@handles_errors
def timeline(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    leaf: LeafOption = None,
    as_of: AsOfOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Each message of the branch with its state in the request now, and each summary's span."""
    from recap.core import lifecycle

    view = lifecycle.timeline(engine(), conversation, settings(), leaf=leaf, as_of=as_of)
    payload = view.as_dict()
    columns = ["id", "role", "state", "tokens", "sent_tokens", "ref"]

    def human() -> None:
        rows = [[m.get(c, "") for c in columns] for m in payload["messages"]]
        table(f"timeline of {conversation}", columns, rows)
        for s in payload["summaries"]:
            typer.echo(
                f"summary {s['id']}: messages {s['first_message_id']}..{s['cutoff_message_id']} "
                f"({s['messages']} messages, {s['tokens']} tokens){' [sent]' if s['sent'] else ''}"
            )
        typer.echo(
            f"request {view.request_tokens:,} tokens of a budget of {view.budget:,}, window "
            f"{view.window:,} (provider tokens)"
        )
        typer.echo(
            f"as Recap counts: {view.estimated_request_tokens:,} of {view.estimated_budget:,} "
            f"(calibration {view.calibration:.4g})"
        )

    emit(payload, as_json, human, verbatim=True)


@handles_errors
def recall(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    ref: Annotated[str, typer.Argument(help="The reference a placeholder or summary names.")],
    offset: Annotated[int, typer.Option(help="Characters to skip.", min=0)] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Print the original a placeholder or summary names (ref=m42, ref=s17, ref=m42.1)."""
    from recap.core import recall as recalls

    found = recalls.recall(engine(), conversation, ref, settings(), offset=offset)
    payload = found.as_dict()

    def human() -> None:
        typer.echo(found.text)
        if found.next_offset is not None:
            typer.echo(f"[truncated: --offset {found.next_offset} reads on]")

    emit(payload, as_json, human, verbatim=True)
