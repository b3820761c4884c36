"""The commands that write a conversation's data and read it back: ``init`` (the schema),
``import``, ``new``, ``add``, ``export``, ``usage`` (the provider's reported token counts) and
``recount`` (token counts made for another model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from recap.workers.cli.common import emit, engine, read_text, service, settings, table
from recap.workers.cli.errors import fail, handles_errors
from recap.workers.cli.options import MESSAGE_ID, TOKEN_COUNT, JsonFlag, LeafOption, WindowOption


@handles_errors
def init(as_json: JsonFlag = False) -> None:
    """Create or migrate the database schema."""
    from recap.core.service.database import upgrade

    created = engine(create=True)
    revision = upgrade(created)
    url = created.url.render_as_string(hide_password=True)
    emit(
        {"database": url, "revision": revision},
        as_json,
        lambda: typer.echo(f"database {url} at revision {revision}"),
    )


@handles_errors
def import_(
    file: Annotated[Path, typer.Argument(help="JSON lines: {id?, messages: [...]} per line.")],
    model: Annotated[str | None, typer.Option(help="Host model of these conversations.")] = None,
    max_input_tokens: WindowOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Import OpenAI-format conversations, all or nothing."""
    records = service.read_import_file(file)
    imported = service.import_conversations(
        engine(),
        records,
        settings(),
        model=model,
        max_input_tokens=max_input_tokens,
        prepare=_ingest(),
    )
    payload = {"conversations": [{"id": cid, "messages": n} for cid, n in imported]}
    emit(
        payload,
        as_json,
        lambda: table("imported", ["conversation", "messages"], [list(x) for x in imported]),
    )


def _ingest() -> service.Prepare | None:
    """The ingest step applied to every new message (tool-output truncation)."""
    return service.Ingest.from_settings(settings())


@handles_errors
def new(
    conversation_id: Annotated[
        str | None, typer.Option("--id", help="Id (default: a UUID).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Host model.")] = None,
    max_input_tokens: WindowOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Create an empty conversation."""
    cid = service.new_conversation(
        engine(), settings(), conversation_id, model=model, max_input_tokens=max_input_tokens
    )
    emit({"id": cid}, as_json, lambda: typer.echo(cid))


@handles_errors
def add(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    role: Annotated[str, typer.Option(help="system, user, assistant or tool.")],
    content: Annotated[str | None, typer.Option(help="Message text.")] = None,
    content_file: Annotated[Path | None, typer.Option(help="Read the text from a file.")] = None,
    tool_call_id: Annotated[
        str | None, typer.Option(help="The call a tool result answers.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Tool name of a tool result.")] = None,
    tool_calls: Annotated[str | None, typer.Option(help="Assistant tool calls as JSON.")] = None,
    parent: Annotated[
        int | None, typer.Option(help="Branch from this message id.", **MESSAGE_ID)
    ] = None,
    fields: Annotated[
        str | None,
        typer.Option(
            help="More message fields as a JSON object (e.g. reasoning_content, or a list "
            "content); the options given win over it; keys starting with _ are refused."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Append one message after the branch head, or branch from --parent."""
    message = _message_from_options(role, content, content_file, tool_call_id, name, tool_calls)
    if fields is not None:
        extra = _fields_object(fields)
        message = {**extra, **{k: v for k, v in message.items() if v is not None or k not in extra}}
    message_id = service.add_message(
        engine(), conversation, message, parent_id=parent, prepare=_ingest()
    )
    emit({"message_id": message_id}, as_json, lambda: typer.echo(str(message_id)))


def _fields_object(text: str) -> dict[str, Any]:
    """The ``--fields`` JSON object."""
    from recap.core.errors import InputError
    from recap.core.values.limits import loads

    value = loads(text, "--fields")
    if not isinstance(value, dict):
        raise InputError("--fields must be a JSON object")
    return value


def _message_from_options(
    role: str,
    content: str | None,
    content_file: Path | None,
    tool_call_id: str | None,
    name: str | None,
    tool_calls: str | None,
) -> dict[str, Any]:
    """The message ``recap add`` appends, from its options (the text read from --content-file)."""
    from recap.core.errors import InputError

    if content is not None and content_file is not None:
        raise InputError("give --content or --content-file, not both")
    if content_file is not None:
        content = read_text(content_file)
    message: dict[str, Any] = {"role": role, "content": content}
    if tool_calls is not None:
        from recap.core.values.limits import loads

        message["tool_calls"] = loads(tool_calls, "--tool-calls")
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    if name is not None:
        message["name"] = name
    return message


@handles_errors
def export(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    leaf: LeafOption = None,
    full: Annotated[bool, typer.Option(help="Put back truncated tool outputs.")] = False,
) -> None:
    """Print the branch as stored, in the import format (always JSON); each message's "id" is
    its message id (an integer, as ``recap add`` gives it), which recap serve and recap import
    take back."""
    payload = service.export_conversation(engine(), conversation, leaf, full=full).as_dict()
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")


@handles_errors
def usage(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    prompt_tokens: Annotated[
        int, typer.Option(help="Input tokens the provider reported.", **TOKEN_COUNT)
    ],
    completion_tokens: Annotated[
        int, typer.Option(help="Output tokens reported.", **TOKEN_COUNT)
    ] = 0,
    cached_tokens: Annotated[
        int, typer.Option(help="Cached input tokens reported.", **TOKEN_COUNT)
    ] = 0,
    leaf: LeafOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Record the provider-reported usage of the request sent at --leaf."""
    payload = service.record_usage(
        engine(),
        conversation,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        leaf=leaf,
    ).as_dict()
    emit(payload, as_json, lambda: table("usage", list(payload), [list(payload.values())]))


@handles_errors
def recount(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    model: Annotated[
        str | None, typer.Option(help="Record that the conversation now uses this model.")
    ] = None,
    max_input_tokens: WindowOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Recount the conversation's stored token counts made for another model, in batches
    (with --model, record the model change first)."""
    from recap.core.service import maintenance

    if model is None and max_input_tokens is not None:
        fail("--max-input-tokens goes with --model")
    recounted = maintenance.recount(
        engine(), conversation, model=model, max_input_tokens=max_input_tokens
    )
    payload = recounted.as_dict()
    emit(payload, as_json, lambda: table("recount", list(payload), [list(payload.values())]))
