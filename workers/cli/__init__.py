"""The ``recap`` command line. Commands that call no model never import litellm or Celery.

The package is laid out by job:

- ``root``: the Typer ``app``, its one-line usage errors and the ``--verbose`` option;
- ``errors``: one masked line on stderr and exit code 1 for what goes wrong in a command, and the
  broker check commands run before sending;
- ``common``: settings, database engine and output (``--json`` or a table) shared by commands;
- ``options`` and ``durations``: shared options and the parsing of their values;
- the commands, one module per job: ``data``, ``views``, ``compression``, ``maintenance``,
  ``run``, ``lifecycle`` and ``memory`` (the ``recap memory`` group).

The commands are registered below, in the order ``recap --help`` lists them.
"""

from __future__ import annotations

from recap.workers.cli import compression, data, lifecycle, maintenance, memory, run, views
from recap.workers.cli.durations import parse_duration
from recap.workers.cli.root import app

__all__ = ["app", "main", "parse_duration"]

app.command()(data.init)
app.command("import")(data.import_)
app.command()(data.new)
app.command()(data.add)
app.command()(data.export)
app.command()(maintenance.sweep)
app.command()(maintenance.cleanup)
app.command()(views.assemble)
app.command()(views.stats)
app.command()(views.summaries)
app.command()(data.usage)
app.command()(compression.compress)
app.command()(compression.reconcile)
app.command()(compression.failures)
app.command()(compression.retry)
app.command()(run.replay)
app.command()(run.demo)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run.worker)
app.command()(run.serve)
app.command()(run.ui)
app.command()(data.recount)
app.command("prune-log")(maintenance.prune_log)
app.command()(lifecycle.pin)
app.command()(lifecycle.attach)
app.command()(lifecycle.merge)
app.command()(lifecycle.delete)
app.command()(lifecycle.conversations)
app.command()(lifecycle.expire)
app.command()(views.timeline)
app.command()(views.recall)
app.add_typer(memory.memory_app, name="memory")


def main() -> None:
    """Console-script entry point."""
    app()
