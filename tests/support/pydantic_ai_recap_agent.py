"""Pydantic AI's ``Agent`` with Recap's ``RecapHistory`` among its capabilities, for Pydantic AI's
own capability tests run with Recap (``tests/test_pydantic_ai_peer_capabilities.py``).

``RecapAgent`` takes the same arguments as ``Agent`` and adds one ``RecapHistory`` to the
capabilities it is given, on the Recap that ``recap_for_agents`` opens (a fresh SQLite database,
copied from a template whose schema is made once). The history keeps each run on the run's own
conversation (no ``conversation_id``: Pydantic AI's, new for each run that does not continue
one), with a window of ``WINDOW`` tokens that the cases fit in and no compression enqueued. The
mode says how it is added: after the agent's own capabilities (``capability``), in front of them
(``first``), or after them as ``ProcessHistory(RecapHistory)`` (``processor``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory

from recap.core.client import Recap
from recap.core.settings import Settings
from recap.integrations.pydantic_ai import RecapHistory
from tests.support.hosts import fresh_recap

WINDOW = 32_000
MODES = ("capability", "first", "processor")


@dataclass
class AgentsRecap:
    """The Recap the agents of one case keep their histories in, the mode they are added in, and
    each ``RecapHistory`` made (one an agent)."""

    recap: Recap
    mode: str
    histories: list[RecapHistory] = field(default_factory=list)


_current: list[AgentsRecap] = []  # the case's, while it runs (cases run one at a time)


@dataclass(frozen=True)
class Template:
    """A Recap database with its schema made, and its settings (read once: each case's are a
    copy naming its own database)."""

    path: Path
    settings: Settings


def make_template(folder: Path) -> Template:
    """A ``Template`` in ``folder``, for ``recap_for_agents`` to copy."""
    with fresh_recap(folder) as host:
        return Template(folder / "r.db", host.settings)


@contextmanager
def recap_for_agents(
    template: Template, folder: Path, mode: str = "capability"
) -> Iterator[AgentsRecap]:
    """While the block runs, each ``RecapAgent`` made gets a ``RecapHistory`` on a fresh Recap in
    ``folder`` (a copy of ``template``), added as ``mode`` says."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    shutil.copy(template.path, folder / "r.db")
    settings = template.settings.model_copy(
        update={"database_url": f"sqlite:///{folder / 'r.db'}", "output_dir": folder / "o"}
    )
    host = Recap(settings, create_schema=False)
    current = AgentsRecap(host, mode)
    _current.append(current)
    try:
        yield current
    finally:
        _current.remove(current)
        host.engine.dispose()


def _with_history(capabilities: Sequence[Any] | None) -> list[Any]:
    if not _current:
        raise RuntimeError("RecapAgent made outside recap_for_agents")
    current = _current[-1]
    history = RecapHistory(recap=current.recap, max_input_tokens=WINDOW, enqueue=False)
    current.histories.append(history)
    own = list(capabilities or ())
    if current.mode == "first":
        return [history, *own]
    if current.mode == "processor":
        return [*own, ProcessHistory(history)]
    return [*own, history]


class RecapAgent(Agent):  # generic as Agent is: the cases write RecapAgent[...] as Agent[...]
    """``Agent`` with a ``RecapHistory`` added to its capabilities (see the module)."""

    def __init__(self, *args: Any, capabilities: Sequence[Any] | None = None, **kwargs: Any):
        super().__init__(*args, capabilities=_with_history(capabilities), **kwargs)
