"""How a reply goes back to a client that speaks another API than chat completions: the
upstream always answers in chat completions, and a ``Shape`` turns its whole reply, or its
stream, into the client's format. Routes without one send the upstream's reply as it came."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recap.workers.serve.streaming import Relay


@dataclass(frozen=True)
class Shape:
    """``body(reply, reply_id)``: the whole reply's bytes (``reply_id`` is the stored reply's
    id, None when nothing is stored); ``relay(stream, storable)``: the stream's events
    (``storable``: false when nothing of it is stored)."""

    body: Callable[[Any, int | None], bytes]
    relay: Callable[[Any, bool], Relay]
