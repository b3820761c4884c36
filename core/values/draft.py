"""The request as ``core.request.assembly``'s stages build it: one frozen ``Draft`` that each stage
takes and returns anew (``dataclasses.replace``), made of a few frozen parts, one per subject.

- ``Unit``: one indivisible piece of history (a message, or a tool call with all its results);
- ``Tally``: the tokens each stage reports (the breakdown adds them up at the end);
- ``Ends``: the messages around the history (system prompt, summary, reminder, and the pinned
  messages a summary covers);
- ``History``: the messages after the cutoff as units, split into the older ones and the tail
  (the last user message on);
- ``TailFit``: what fitting the tail did (results shortened, steps left out, summary cut);
- ``Context``: the context files sent and the names of those left out;
- ``Fitted``: the history as sent, from which older unit on.

The collections are typed as read-only (``Sequence``, ``Mapping``): a stage builds new ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from recap.core.values.records import ClearingRec, Msg

Records = tuple[tuple[int, int], ...]  # (message id, tokens) to record as clearings


class Unit(NamedTuple):
    """One indivisible piece of history: a message, or a tool call with all its results (a
    named tuple, like ``Msg``: a request builds one per message after the cutoff)."""

    items: tuple[Msg | dict[str, Any], ...]  # stored messages are rendered only if it is kept
    ids: tuple[int, ...]
    tokens: int
    is_user: bool
    pinned: bool = False  # it holds a pinned message: always sent, counted as a fixed part


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """The request's tokens as the stages report them; the breakdown adds them up at the end.

    ``history`` holds what the stages after the fit change in the history's count (media
    finished, reasoning counted apart, turns merged, cache marks); the fitted history itself
    is read from the fit (``Draft.fitted_tokens``)."""

    priming: int = 0  # the tokens every reply is primed with
    system: int = 0
    summary: int = 0
    reminder: int = 0
    tools: int = 0
    pinned: int = 0  # pinned messages: history, but fitted as a fixed part
    context: int = 0
    history: int = 0
    media: int = 0
    reasoning: int = 0
    memory: int = 0  # the user's memory message

    @property
    def fixed(self) -> int:
        """The parts fitted before any history, with the reply priming."""
        return (
            self.system
            + self.summary
            + self.reminder
            + self.tools
            + self.pinned
            + self.priming
            + self.memory
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Ends:
    """The messages around the history: the system prompt and the summary before it, the
    pinned messages a summary covers (``block``, right after it), the reminder last."""

    system: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None  # the user's memory, right after the system prompt
    summary: dict[str, Any] | None = None
    reminder: dict[str, Any] | None = None
    block: Sequence[dict[str, Any]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    """The messages after the cutoff (``after``) as units with valid tool pairs: the ``older``
    ones and the ``tail`` (the last user message on); the orphan results left out, and whether
    a call id is used twice (only then are ids made unique)."""

    after: Sequence[Msg] = ()
    older: Sequence[Unit] = ()
    tail: Sequence[Unit] = ()
    orphans: Sequence[int] = ()
    repeated_call_ids: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TailFit:
    """What fitting the tail did: its ``tokens`` as sent, the results shortened (to record),
    the steps after the last user message left out, whether it did not fit whole (``cut``:
    results shortened or steps left out) and whether the summary was cut to make room."""

    tokens: int = 0
    shortened: Records = ()
    cut_steps: Sequence[int] = ()
    cut: bool = False
    summary_cut: bool = False


@dataclass(frozen=True, slots=True)
class Context:
    """The context-file messages sent (with the note naming those left out), and their names."""

    messages: Sequence[dict[str, Any]] = ()
    forgotten: Sequence[str] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    """The history as sent: from which older unit on, and its messages and tokens."""

    kept_from: int
    gap_tokens: int
    kept_tokens: int  # of the kept older units, as stored
    messages: Sequence[dict[str, Any]]  # gap note, kept older units, context files, the tail
    renamed: int  # tokens the fresh ids of repeated call ids add
    pinned_at: tuple[int, ...] = ()  # positions in ``messages`` of the pinned messages


@dataclass(frozen=True, slots=True, kw_only=True)
class Draft:
    """The request as the stages build it: the branch and clearings as they apply (media aged,
    results shortened), the tokens, and what each stage has made."""

    branch: Sequence[Msg]
    root: Msg | None  # the stored system prompt, when the branch starts with one
    cleared: Mapping[int, ClearingRec]  # the clearings that apply (none to pinned messages)
    tally: Tally = Tally()
    ends: Ends = Ends()
    history: History = History()
    media_aged: Records = ()  # messages whose media all aged now (to record)
    reasoning_dropped: Records = ()  # older messages whose thinking is left out (to record)
    tail: TailFit = TailFit()
    room: int = 0  # tokens left for older history
    context: Context = Context()
    fitted: Fitted | None = None
    messages: Sequence[dict[str, Any]] = ()  # the whole request, once the history is fitted

    def fitted_tokens(self) -> int:
        """The history as fitted: the tail, the gap note, the kept older units and the tokens
        fresh call ids add."""
        fitted = self.fitted
        assert fitted is not None
        return self.tail.tokens + fitted.gap_tokens + fitted.kept_tokens + fitted.renamed
