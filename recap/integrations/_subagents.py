"""Which conversation a LangGraph agent's run is, when it runs inside another agent's tool call.

An agent invoked from a tool of another agent (a sub-agent used as a tool, ``agent.invoke(...)``
inside an ``@tool``) inherits the calling run's config, ``thread_id`` included. Named by its
``thread_id`` alone, the sub-agent's messages would be stored in the parent's conversation,
between the parent's tool call and its result. LangGraph marks where a run sits in the config's
``checkpoint_ns``: ``"tools:<task id>|model:<task id>"`` for a node of a graph run inside the
``tools`` node of another graph. A ``RecapMiddleware`` run whose namespace has a ``tools`` step
above its own graph, under a run of a ``RecapMiddleware`` on the same thread, is that run's
sub-agent: its conversation is the parent's id followed by ``/`` and the tool call's step (one
conversation per tool call, as a sub-agent invoked without a checkpointer starts afresh each
call), and the parent attaches it after the tool's result (``Recap.attach``).

What a parent knows about its sub-agents lives in this process (the sub-agent runs inside the
parent's tool call, in the same process): a bounded table of the runs seen and of the
sub-agents each parent has yet to attach.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NS_SEPARATOR = "|"  # between the steps of a checkpoint namespace (LangGraph's NS_SEP)
NS_END = ":"  # between a step's node name and its task id (LangGraph's NS_END)
TOOLS_NODE = "tools"  # the node that runs an agent's tool calls (create_agent, ToolNode)
RUNS_REMEMBERED = 4096  # (thread, graph position) -> conversation entries kept

_lock = threading.Lock()
_runs: OrderedDict[tuple[str, str], str] = OrderedDict()
_pending: dict[str, list[str]] = {}


@dataclass(frozen=True)
class Placement:
    """Where a run sits: its conversation and, for a sub-agent, its parent's conversation."""

    conversation_id: str
    parent: str | None = None


def place(configurable: Mapping[str, Any], fixed: str | None) -> Placement | None:
    """The run's conversation (``fixed`` where the middleware names one, else the thread's, or
    the sub-agent's under its parent's); None when there is neither a fixed name nor a thread.
    Remembers the run as a possible parent of sub-agents run from its tools."""
    thread = configurable.get("thread_id")
    thread_name = str(thread) if thread is not None else None
    steps = _steps(configurable.get("checkpoint_ns"))
    parent, tool_step = _parent(thread_name, steps)
    if fixed:
        cid: str | None = fixed
    elif parent is not None:
        cid = f"{parent}/{tool_step}"
    else:
        cid = thread_name
    if not cid:
        return None
    if thread_name is not None:
        _remember((thread_name, NS_SEPARATOR.join(steps[:-1])), cid)
    if parent is not None and parent != cid:
        with _lock:
            waiting = _pending.setdefault(parent, [])
            if cid not in waiting:
                waiting.append(cid)
            while len(_pending) > RUNS_REMEMBERED:
                del _pending[next(iter(_pending))]
    return Placement(cid, parent if parent != cid else None)


def waiting(parent: str) -> list[str]:
    """The sub-agents' conversations ``parent`` has yet to attach, oldest first."""
    with _lock:
        return list(_pending.get(parent, ()))


def attached(parent: str, sub: str) -> None:
    """``sub`` is attached to ``parent`` (or never will be): forget it."""
    with _lock:
        subs = _pending.get(parent)
        if subs and sub in subs:
            subs.remove(sub)
        if not subs:
            _pending.pop(parent, None)


def _steps(namespace: Any) -> list[str]:
    return namespace.split(NS_SEPARATOR) if isinstance(namespace, str) and namespace else []


def _parent(thread: str | None, steps: list[str]) -> tuple[str | None, str]:
    """The conversation of the innermost run whose ``tools`` step holds this one, and that
    step; (None, "") when the run is not inside a remembered run's tool call."""
    if thread is None:
        return None, ""
    for index in range(len(steps) - 2, -1, -1):
        if steps[index].split(NS_END, 1)[0] != TOOLS_NODE:
            continue
        with _lock:
            parent = _runs.get((thread, NS_SEPARATOR.join(steps[:index])))
        if parent is not None:
            return parent, steps[index]
    return None, ""


def _remember(key: tuple[str, str], cid: str) -> None:
    with _lock:
        _runs[key] = cid
        _runs.move_to_end(key)
        while len(_runs) > RUNS_REMEMBERED:
            _runs.popitem(last=False)
