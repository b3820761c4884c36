"""The ``recap`` Typer app itself: usage errors as one line on stderr, and the ``--verbose``
option every command shares. The command modules define the commands; ``workers.cli`` registers
them on this app."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup


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


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress too.")] = False,
) -> None:
    """Readable log lines for the command line (workers log JSON)."""
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="INFO" if verbose else "WARNING")
