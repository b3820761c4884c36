"""What every stage of ``assemble`` is given (``Given``: the stored branch, the request, the target
and what follows from them, worked out once) and the draft before the first stage (``start``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from recap.core.counting import media, reasoning, tokens
from recap.core.errors import BudgetError, InputError
from recap.core.request import pins as pin_rules
from recap.core.request.assembly.parts import stored_prompt
from recap.core.values.assembly import StoredBranch
from recap.core.values.draft import Draft, Tally, Unit
from recap.core.values.records import Msg
from recap.core.values.request import RequestSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """The model a request is for and the limits it must keep: ``window`` tokens less the
    ``safety_margin``, or ``budget`` (estimated tokens) when the caller worked it out
    (``core.counting.budget``: output reserve and calibration included), and what of its media
    is sent in full (``media_policy``, see ``core.counting.media``; default: the defaults)."""

    model: str
    window: int
    safety_margin: float
    budget: int | None = None
    media_policy: media.MediaPolicy | None = None
    thinking_turns: int = 1  # the user turns whose reasoning is sent (the one in progress: 1)

    def __post_init__(self) -> None:
        """Refuse a window or a margin no request can be built within."""
        if self.window <= 0:
            raise InputError(f"the window must be a positive number of tokens, got {self.window}")
        if not 0 <= self.safety_margin < 1:
            raise InputError(f"the safety margin must be in [0, 1), got {self.safety_margin}")
        if self.thinking_turns < 1:
            raise InputError(f"thinking turns must be at least 1, got {self.thinking_turns}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Given:
    """What the stages are given and never change: the stored branch, the request and the
    target, with the tokenizer, the provider family (what reasoning it takes back), the pinned
    ids, the media policy and the budget worked out from them once."""

    stored: StoredBranch
    request: RequestSpec
    target: Target
    encoding: str
    family: str
    pins: frozenset[int]
    policy: media.MediaPolicy
    budget: int

    @classmethod
    def of(cls, stored: StoredBranch, request: RequestSpec, target: Target) -> Given:
        """The tokenizer, the pins, the media policy and the budget of one request."""
        model = target.model
        return cls(
            stored=stored,
            request=request,
            target=target,
            encoding=tokens.encoding_name_for(model),
            family=reasoning.family_of(model),
            pins=frozenset(m.id for m in stored.pinned),
            policy=target.media_policy or media.MediaPolicy(),
            budget=(
                tokens.available_tokens(target.window, target.safety_margin)
                if target.budget is None
                else target.budget
            ),
        )

    def tail_error(self, tail_tokens: int, fixed: int) -> BudgetError:
        """The error for a tail of ``tail_tokens`` that the ``fixed`` parts leave no room for."""
        budget, window, margin = self.budget, self.target.window, self.target.safety_margin
        return BudgetError(
            f"the last user message and what follows need {tail_tokens} tokens, but only "
            f"{max(budget - fixed, 0)} of the {budget}-token budget (window {window}, safety "
            f"margin {margin:g}) are left after the system prompt, tools, reminder, "
            f"summary and pinned messages ({fixed} tokens); compress the conversation or allow a "
            "larger window"
        )


def thinking_from(given: Given, older: Sequence[Unit]) -> int:
    """Where the older units within the thinking window start (``Target.thinking_turns``: the
    turn in progress, the tail, is the first; each user message before it starts one more):
    their reasoning is sent as the turn in progress's is. ``len(older)`` for a window of one."""
    wanted = given.target.thinking_turns - 1
    start = len(older)
    while wanted > 0 and start > 0:
        start -= 1
        first = older[start].items[0]
        if isinstance(first, Msg) and first.role == "user":
            wanted -= 1
    return start


Stage = Callable[[Given, Draft], Draft]
"""One step of ``assemble``: reads what it is given and the draft, returns a new draft."""


def start(given: Given) -> Draft:
    """The draft before any stage: the branch as stored, its system prompt, the clearings that
    apply to unpinned messages, and the reply priming counted."""
    stored = given.stored
    return Draft(
        branch=stored.branch,
        root=stored_prompt(stored.branch),
        cleared=pin_rules.effective_clearings(stored.clearings or {}, given.pins),
        tally=Tally(priming=tokens.TOKENS_REPLY_PRIMING),
    )
