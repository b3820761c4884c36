"""The ``recap`` command line. Commands that call no model never import litellm or Celery."""

from __future__ import annotations

import functools
import importlib
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from core.errors import RecapError
from core.values.actions import Action
from core.values.limits import INT32_MAX, MESSAGE_ID_MAX, TOKENS_MAX
from workers import moments

if TYPE_CHECKING:
    from core.settings import Settings


class _OnFirstUse:
    """A module imported when first used: `recap --help` and argument errors stay instant, and
    each command imports only what it needs (SQLAlchemy alone takes a while to import)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)


service: Any = _OnFirstUse("core.service")


class _OneLineErrors(TyperGroup):
    """Usage errors (a missing option, a value out of range) as one line on stderr, like every
    other error: click's and typer's own rendering spans a usage block or a box."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        run = functools.partial(
            super().main,
            args,
            prog_name,
            complete_var,
            standalone_mode=False,
            windows_expand_args=windows_expand_args,
            **extra,
        )
        if not standalone_mode:
            return run()
        try:
            code = run()
        except Exception as exc:  # typer vendors click: its exceptions are matched by shape
            sys.exit(_usage_error(exc))
        sys.exit(code if isinstance(code, int) else 0)


def _usage_error(exc: Exception) -> int:
    """Print a usage error as one line; its exit code. Anything else is re-raised."""
    kind = type(exc).__name__
    if kind == "NoArgsIsHelpError":
        exc.show()  # type: ignore[attr-defined]  # `recap` alone prints the help
    elif kind == "Abort":
        typer.echo("recap: error: aborted", err=True)
        return 1
    elif hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int):
        context = getattr(exc, "ctx", None)
        hint = f" (see `{context.command_path} --help`)" if context is not None else ""
        message = " ".join(exc.format_message().split())
        typer.echo(f"recap: error: {message}{hint}", err=True)
    else:
        raise exc
    return int(exc.exit_code)  # type: ignore[attr-defined]


app = typer.Typer(
    cls=_OneLineErrors,
    name="recap",
    help="Keep LLM conversations inside their context window, compressed in the background.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])
USER_ERRORS = (RecapError,)  # settings, model and input errors all derive from it

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]

# Every integer option is bounded by the column it ends up in, on SQLite and PostgreSQL alike
# (core.values.limits): message ids are 64-bit, token counts and windows 32-bit.
MESSAGE_ID = {"min": 1, "max": MESSAGE_ID_MAX}
WINDOW = {"min": 1, "max": TOKENS_MAX}
TOKEN_COUNT = {"min": 0, "max": INT32_MAX}
LeafOption = Annotated[
    int | None,
    typer.Option("--leaf", help="Leaf message id of the branch (default: latest).", **MESSAGE_ID),
]
WindowOption = Annotated[int | None, typer.Option(help="Window override (tokens).", **WINDOW)]
MAX_DAYS = 36_500  # a hundred years: any longer retention or idle time is a typo
AsOfOption = Annotated[
    datetime | None,
    typer.Option(
        "--as-of",
        help="As of this ISO 8601 time: only summaries and clearings recorded by then.",
        parser=moments.parse_moment,
    ),
]


def finite(low: float, high: float, *, open_low: bool) -> Callable[[str], float]:
    """A parser for a float option: a finite number in ``low..high`` (``open_low`` excludes
    ``low``). NaN would pass any comparison-based guard, so it is refused here, by type."""

    def parse(text: str) -> float:
        try:
            number = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number") from None
        too_low = number <= low if open_low else number < low
        if not math.isfinite(number) or too_low or number > high:
            bound = ">" if open_low else ">="
            raise typer.BadParameter(f"{text} is not a finite number {bound} {low:g}, <= {high:g}")
        return number

    return parse


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress too.")] = False,
) -> None:
    """Readable log lines for the command line (workers log JSON)."""
    from workers.logs import configure_logging

    configure_logging(json_output=False, level="INFO" if verbose else "WARNING")


def fail(message: str, code: int = 1) -> None:
    """One clear line on stderr (masked: an error can quote a secret), then exit non-zero."""
    from core.redact import one_line, redact

    typer.echo(f"recap: error: {one_line(redact(message, _known_secrets()))}", err=True)
    raise typer.Exit(code)


def _known_secrets() -> list[str]:
    """The configured secrets, or none when the settings themselves are what failed."""
    from core.redact import known_secrets

    try:
        return known_secrets(settings())
    except Exception:  # invalid settings: key-shaped strings are still masked by pattern
        return []


def handles_errors(func: F) -> F:
    """Turn Recap's user errors into one line on stderr and a non-zero exit, no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except USER_ERRORS as exc:
            fail(str(exc))
        except Exception as exc:
            message = _environment_error(exc)
            if message is None:
                raise
            fail(message)

    return wrapper  # type: ignore[return-value]


def _environment_error(exc: Exception) -> str | None:
    """One line for what is wrong around the command (database, broker, files), or None for a
    defect, which keeps its traceback."""
    if isinstance(exc, RecursionError):
        return "the input is nested too deeply to read"
    broker_error = _broker_error(exc)
    if broker_error is not None:
        return broker_error
    if "sqlalchemy" in sys.modules:
        from sqlalchemy.exc import DBAPIError

        from core.storage.db import INIT_HINT, is_schema_missing

        if is_schema_missing(exc):
            return f"the database has no Recap schema; {INIT_HINT}"
        if isinstance(exc, DBAPIError):
            reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
            return f"database error ({_database_named()}): {reason or type(exc.orig).__name__}"
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    return None


def _database_named() -> str:
    """``RECAP_DATABASE_URL`` and its value, password hidden, for a database error."""
    from core.storage.db import display_url

    return f"RECAP_DATABASE_URL={display_url(settings().database_url)}"


def _broker_error(exc: Exception) -> str | None:
    if "kombu" not in sys.modules:
        return None
    from kombu.exceptions import OperationalError

    errors: tuple[type[BaseException], ...] = (OperationalError,)
    if "amqp" in sys.modules:  # RabbitMQ refusing the login is not wrapped by kombu
        # amqp ships no types (a stub gap): its exceptions are classes all the same
        from amqp.exceptions import (  # type: ignore[import-untyped,unused-ignore]
            AccessRefused,
        )
        from amqp.exceptions import ConnectionError as AMQPConnectionError

        errors += (AccessRefused, AMQPConnectionError)
    if not isinstance(exc, errors):
        return None
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot reach the broker (RECAP_BROKER_URL): {reason}"


# A broker that has not answered after these tries (about a second) is down: say so, rather
# than let kombu retry for minutes or print its traceback.
BROKER_CONNECT_RETRIES = 2
BROKER_RETRY_SECONDS = 0.3
BROKER_CONNECT_TIMEOUT = 2.0


def require_broker() -> None:
    """Check that the configured broker answers, with bounded retries, before a command sends
    anything (or changes anything in the database on the way)."""
    from workers.app import app as celery_app

    with celery_app.connection_for_write() as connection:
        connection.ensure_connection(
            max_retries=BROKER_CONNECT_RETRIES,
            interval_start=BROKER_RETRY_SECONDS,
            interval_step=BROKER_RETRY_SECONDS,
            interval_max=BROKER_RETRY_SECONDS,
            timeout=BROKER_CONNECT_TIMEOUT,
        )


def settings() -> Settings:
    """The settings, read once; an invalid value is one clear error."""
    from core.redact import known_secrets
    from core.settings import get_settings
    from workers.logs import register_secrets

    loaded = get_settings()
    register_secrets(known_secrets(loaded))  # log lines on stderr mask them too
    return loaded


def engine(*, create: bool = False) -> Any:
    """The engine for ``RECAP_DATABASE_URL``. Only ``create`` (``recap init``) creates an SQLite
    file: any other command on a missing one says to run ``recap init`` and leaves no file."""
    from core.storage.db import get_engine

    return get_engine(settings().database_url, create=create)


def emit(
    payload: dict[str, Any],
    as_json: bool,
    human: Callable[[], None] | None = None,
    *,
    verbatim: bool = False,
) -> None:
    """Print the JSON object, or the human rendering when ``--json`` is not given. Its texts are
    masked first, in place, so the human rendering shows them masked too; ``verbatim`` (a
    conversation's own content) masks only the configured secrets, never key-shaped text."""
    payload.update(_masked(payload, _known_secrets(), verbatim))
    if as_json or human is None:
        sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
    else:
        human()


def _masked(value: Any, secrets: list[str], verbatim: bool) -> Any:
    from core.redact import mask_value, redact

    if isinstance(value, str):
        if not verbatim:
            return redact(value, secrets)
        for secret in secrets:
            value = value.replace(secret, mask_value(secret))
        return value
    if isinstance(value, dict):
        return {k: _masked(v, secrets, verbatim) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v, secrets, verbatim) for v in value]
    return value


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """A rich table on stdout."""
    from rich.console import Console
    from rich.table import Table

    view = Table(title=title)
    for column in columns:
        view.add_column(column)
    for row in rows:
        view.add_row(*(str(cell) for cell in row))
    Console().print(view)


@app.command()
@handles_errors
def init(as_json: JsonFlag = False) -> None:
    """Create or migrate the database schema."""
    from core.storage.migrate import upgrade

    created = engine(create=True)
    revision = upgrade(created)
    url = created.url.render_as_string(hide_password=True)
    emit(
        {"database": url, "revision": revision},
        as_json,
        lambda: typer.echo(f"database {url} at revision {revision}"),
    )


@app.command("import")
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
    from core.storage.outputs import Ingest

    return Ingest.from_settings(settings())


@app.command()
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


@app.command()
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
    from core.errors import InputError
    from core.values.limits import loads

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
    from core.errors import InputError

    if content is not None and content_file is not None:
        raise InputError("give --content or --content-file, not both")
    if content_file is not None:
        content = _read_text(content_file)
    message: dict[str, Any] = {"role": role, "content": content}
    if tool_calls is not None:
        from core.values.limits import loads

        message["tool_calls"] = loads(tool_calls, "--tool-calls")
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    if name is not None:
        message["name"] = name
    return message


@app.command()
@handles_errors
def export(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    leaf: LeafOption = None,
    full: Annotated[bool, typer.Option(help="Put back truncated tool outputs.")] = False,
) -> None:
    """Print the branch as stored, in the import format (always JSON)."""
    payload = service.export_conversation(engine(), conversation, leaf, full=full).as_dict()
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")


@app.command()
@handles_errors
def sweep(
    idle_minutes: Annotated[
        float | None,
        typer.Option(
            help="Idle time before clearing (default: RECAP_IDLE_MINUTES; 0 clears now).",
            parser=finite(0, MAX_DAYS * 24 * 60, open_low=False),
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Clear old tool results of idle conversations now (the beat sweep, all batches)."""
    from core.storage.models import utcnow
    from core.storage.sweep import sweep_idle

    result = sweep_idle(engine(), settings(), now=utcnow(), idle_minutes=idle_minutes)
    payload = result.as_dict()
    emit(payload, as_json, lambda: table("sweep", list(payload), [list(payload.values())]))


@app.command()
@handles_errors
def cleanup(
    retention_days: Annotated[
        float | None,
        typer.Option(
            help="Keep saved outputs this long (default: RECAP_OUTPUT_RETENTION_DAYS).",
            parser=finite(0, MAX_DAYS, open_low=False),
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete saved tool outputs older than the retention now (the beat cleanup)."""
    import time

    from core.storage.outputs import cleanup_outputs

    days = settings().output_retention_days if retention_days is None else retention_days
    result = cleanup_outputs(settings().output_dir, now=time.time(), retention_days=days)
    payload = result.as_dict()
    emit(payload, as_json, lambda: table("cleanup", list(payload), [list(payload.values())]))


@app.command()
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
    as_json: JsonFlag = False,
) -> None:
    """Print the request the host would send now (or would have sent at --as-of TIME)."""
    from core.request.assembly import ContextFile

    files = [ContextFile(str(path), _read_text(path)) for path in context_file or ()]
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


def _read_text(path: Path) -> str:
    """A file the command was given, within ``RECAP_MAX_INPUT_BYTES``."""
    from core.inputs import read_text

    return read_text(path, settings().max_input_bytes)


def _read_tools(path: Path) -> list[dict[str, Any]]:
    """Tool schemas from a JSON file: a list of objects, or an object with a ``tools`` list."""
    from core.errors import InputError
    from core.values.limits import loads

    data = loads(_read_text(path), str(path))
    if isinstance(data, dict):
        data = data.get("tools")
    if not isinstance(data, list) or not all(isinstance(tool, dict) for tool in data):
        raise InputError(f"{path}: expected a list of tool schemas (JSON objects)")
    return data


@app.command()
@handles_errors
def stats(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    leaf: LeafOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Context pressure, without calling any model."""
    payload = service.conversation_stats(engine(), conversation, settings(), leaf).as_dict()
    emit(
        payload,
        as_json,
        lambda: table("stats", list(payload), [list(payload.values())]),
    )


@app.command()
@handles_errors
def summaries(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    as_json: JsonFlag = False,
) -> None:
    """List the conversation's summaries, oldest first."""
    rows = [row.as_dict() for row in service.list_summaries(engine(), conversation)]
    columns = [
        "id",
        "cutoff_message_id",
        "previous_summary_id",
        "tokens",
        "model",
        "identifier_retention",
        "created_at",
    ]
    emit(
        {"summaries": rows},
        as_json,
        lambda: table("summaries", columns, [[r[c] for c in columns] for r in rows]),
    )


@app.command()
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


@app.command()
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
        from workers.app import app as celery_app
        from workers.enqueue import CompressJob, send

        require_broker()
        task = send(celery_app, CompressJob(conversation, leaf, force))
        emit({"task_id": str(task.id)}, as_json, lambda: typer.echo(str(task.id)))
        return
    from workers.compress import run_with_retries
    from workers.logs import configure_logging

    configure_logging(json_output=False, level="WARNING")  # stdout keeps only the result
    payload = run_with_retries(engine(), settings(), conversation, leaf, force).as_dict()
    emit(payload, as_json, lambda: table("compress", list(payload), [list(payload.values())]))
    if payload["action"] == Action.FAILED:
        raise typer.Exit(1)


@app.command()
@handles_errors
def reconcile(as_json: JsonFlag = False) -> None:
    """Re-enqueue conversations over their trigger whose last run is missing or died."""
    from workers.reconcile import reconcile as reconcile_pass
    from workers.tasks import enqueue

    require_broker()  # before the pass marks anything checked
    payload = reconcile_pass(engine(), settings(), enqueue)
    emit(payload, as_json, lambda: typer.echo(f"enqueued {payload['enqueued']}"))


DURATION_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}  # seconds per unit
MAX_DURATION_DAYS = 3_650  # ten years: a longer look-back is a typo, and overflows a datetime
SinceOption = Annotated[
    str,
    typer.Option("--since", help="How far back to look: 30m, 2h, 7d (s, m, h, d or w)."),
]


def parse_duration(text: str) -> timedelta:
    """``30m``, ``2h``, ``7d`` as a positive timedelta; ``InputError`` for anything else."""
    from core.errors import InputError

    match = re.fullmatch(r"\s*(\d{1,7}(?:\.\d{1,6})?)\s*([smhdw])\s*", text.lower())
    seconds = float(match[1]) * DURATION_UNITS[match[2]] if match else 0.0
    if not match or seconds <= 0 or seconds > MAX_DURATION_DAYS * DURATION_UNITS["d"]:
        raise InputError(
            f"--since: expected a positive duration like 30m, 2h or 7d (at most "
            f"{MAX_DURATION_DAYS} days), got {text!r}"
        )
    return timedelta(seconds=seconds)


def _failed_since(since: str, conversations: list[str] | None = None) -> list[Any]:
    from core.storage.db import session_scope
    from core.storage.models import utcnow
    from core.storage.store import failed_runs

    moment = utcnow() - parse_duration(since)
    with session_scope(engine()) as session:
        return failed_runs(session, since=moment, conversation_ids=conversations)


@app.command()
@handles_errors
def failures(since: SinceOption = "24h", as_json: JsonFlag = False) -> None:
    """Recent failed compressions not settled since: conversation, when, reason, attempts."""
    payload = {"failures": [run.as_dict() for run in _failed_since(since)]}
    columns = ["conversation_id", "at", "attempts", "reason"]

    def human() -> None:  # reads the payload after emit masked it
        rows = [[run[c] for c in columns] for run in payload["failures"]]
        table(f"failed in the last {since}", columns, rows)

    emit(payload, as_json, human)


@app.command()
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
    from core.errors import InputError

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
    from core.storage.db import session_scope
    from core.storage.store import get_conversation

    with session_scope(engine()) as session:
        for conversation in conversations:
            get_conversation(session, conversation)
    return conversations


def _enqueue_all(conversations: list[str], *, force: bool) -> list[str]:
    """Send one task per conversation; an unreachable broker is one line, not a traceback."""
    from kombu.exceptions import OperationalError

    from workers.tasks import enqueue

    try:
        return [enqueue(conversation, force=force) for conversation in conversations]
    except OperationalError as exc:
        fail(f"cannot reach the broker: {exc}")
        raise AssertionError("unreachable") from None


@app.command()
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
    from workers import replay as replaying

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


@app.command()
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

    from workers import demo as demo_run
    from workers.logs import configure_logging

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


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
@handles_errors
def worker(
    ctx: typer.Context,
    queues: Annotated[
        str, typer.Option(help="compress, maintenance, or both (two worker processes).")
    ] = "compress,maintenance",
    beat: Annotated[bool, typer.Option(help="Embed beat (single-machine setups).")] = False,
) -> None:
    """Start workers: threads for `compress`, a small pool for `maintenance`. Other Celery
    worker arguments are passed through (for example --concurrency 32)."""
    from workers import runner

    settings()  # an invalid setting stops here, in one line
    names = [q.strip() for q in queues.split(",") if q.strip()]
    if sorted(names) == ["compress", "maintenance"]:
        raise typer.Exit(runner.run_both(beat=beat, extra=ctx.args))
    if len(names) != 1:
        fail("--queues takes compress, maintenance, or compress,maintenance")
    raise typer.Exit(runner.run_one(names[0], beat=beat, extra=ctx.args))


@app.command()
@handles_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65_535)] = 8400,
) -> None:
    """Serve OpenAI's chat-completions and Responses APIs and Anthropic's Messages API over
    Recap (clients authenticate with a key from RECAP_SERVE_KEYS; see docs/serve-apis.md)."""
    settings()  # an invalid setting stops here, in one line (before the server's imports)
    from workers.serve.app import serve as run_server

    run_server(host, port)


@app.command()
@handles_errors
def ui(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65_535)] = 8401,
) -> None:
    """Serve the web console at /ui (log in with a key of RECAP_UI_KEYS; docs/console.md)."""
    settings()  # an invalid setting stops here, in one line; a missing console key in run_console
    from workers.ui.app import serve as run_console

    run_console(host, port)


@app.command()
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
    from core.storage import recount as recounts

    if model is not None:
        recounts.set_model(engine(), conversation, model, max_input_tokens=max_input_tokens)
    elif max_input_tokens is not None:
        fail("--max-input-tokens goes with --model")
    payload = recounts.recount_conversation(engine(), conversation).as_dict()
    emit(payload, as_json, lambda: table("recount", list(payload), [list(payload.values())]))


@app.command("prune-log")
@handles_errors
def prune_log(as_json: JsonFlag = False) -> None:
    """Delete compaction-log rows past RECAP_LOG_RETENTION_DAYS (skipped runs) and
    RECAP_LOG_HISTORY_DAYS (every run) now (the beat pruning)."""
    from core.storage.compaction_log import prune_log as prune
    from core.storage.models import utcnow

    current = settings()
    result = prune(
        engine(),
        now=utcnow(),
        retention_days=current.log_retention_days,
        history_days=current.log_history_days,
        max_batches=None,
    )
    payload = result.as_dict()
    emit(payload, as_json, lambda: table("prune-log", list(payload), [list(payload.values())]))


from workers import cli_lifecycle as _lifecycle  # noqa: E402,F401  (registers its commands)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # `python -m workers.cli`: the module as imported, whose app holds
    from workers.cli import main as imported_main  # the commands other modules register on it

    imported_main()
