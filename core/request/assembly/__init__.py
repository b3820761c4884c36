"""The request view (pure): from a stored branch to the request the host sends its model.

``assemble`` takes three plain values: what is stored (``StoredBranch``: the branch, the summary
that applies to it, the clearings, the pinned messages), what the host asks for
(``core.values.request.RequestSpec``: its system prompt, tools, reminder, context files and
rendering) and the model with its limits (``Target``); it returns OpenAI-format messages with
their token breakdown. Nothing here reads a database or a file: ``core.service.assemble`` loads the
branch in one short session and calls it.

Stages: ``assemble`` runs ``STAGES`` in order, one module each, all with one signature
(``given.Stage``): each takes what it is given (``given.Given``: the stored branch, the request,
the target and what follows from them, worked out once) and the draft so far
(``core.values.draft.Draft``, frozen), and returns a new draft; none changes its input. They are
media ageing (``media_ageing``), units (``units``), reasoning dropped (``reasoning_dropped``),
the fixed parts (``fixed``), the tail (``tail``), context files (``context``), older history
(``history``), media finished with the byte guard (``media_finish``), reasoning sent
(``reasoning_sent``), text-only merging (``alternate``) and cache marks (``cache_marks``). Each
reports its own tokens in the draft's tally, and the breakdown is their sum (``result``).

Order of the request::

    system, [summary], older history, [context files, forgotten-file note],
    last user message, the tool calls and results after it, [reminder]

Tokens: the history uses the per-message counts stored at ingest (a cleared result counts as
``tokens - tokens_reclaimed``, as in ``core.request.branch.effective_history_tokens``); only the
parts built now (system prompt, summary message, tools, reminder, context files, stub results,
text-only turns) are counted, and those counts are cached by text (``parts``).

Budget: ``budget = window x (1 - safety_margin)``. The fixed parts (system, tools, reminder, summary
and the reply priming) and the tail (the last user message and everything after it) must fit, else
``BudgetError``: the tail is never cut silently. Context files then take what they need, each one
kept or forgotten whole. Older history is added newest first and stops at the first unit that does
not fit, so what is kept is one contiguous newest run (a stable prefix keeps the prompt cache
useful). A unit is a message, or an assistant tool call with all its results: a call and its
results are kept or dropped together.

Tool pairs: every call gets exactly one result, placed right after the call's message (a result
stored later, after another message, is moved up to it); a call with no recorded result gets a
stub saying so; a result that answers no call on the sent branch (its call was summarized away, or
it repeats an answered call) is dropped and listed in ``dropped_message_ids``.

Pinned messages (``pinned``, see ``core.request.pins``) are fixed parts: sent in their place (their
unit is never left out or shortened, and no clearing applies to them), or right after the summary
once it covers them.
"""

from __future__ import annotations

from recap.core.request.assembly import (
    alternate,
    cache_marks,
    context,
    fixed,
    history,
    media_ageing,
    media_finish,
    reasoning_dropped,
    reasoning_sent,
    tail,
    units,
)
from recap.core.request.assembly.given import Given, Stage, start
from recap.core.request.assembly.given import Target as Target
from recap.core.request.assembly.omit import LightRow as LightRow
from recap.core.request.assembly.omit import omittable as omittable
from recap.core.request.assembly.parts import ADDED_ROLE as ADDED_ROLE
from recap.core.request.assembly.parts import GAP_NOTE as GAP_NOTE
from recap.core.request.assembly.parts import REASONING_CLEARING as REASONING_CLEARING
from recap.core.request.assembly.parts import fixed_part_tokens as fixed_part_tokens
from recap.core.request.assembly.parts import stored_prompt as stored_prompt
from recap.core.request.assembly.rendering import render_stored as render_stored
from recap.core.request.assembly.rendering import unique_call_ids as unique_call_ids
from recap.core.request.assembly.result import result
from recap.core.values.assembly import AssembledRequest as AssembledRequest
from recap.core.values.assembly import StoredBranch as StoredBranch
from recap.core.values.assembly import TokenBreakdown as TokenBreakdown
from recap.core.values.request import NO_PARTS, RequestSpec
from recap.core.values.request import ContextFile as ContextFile  # re-exported: hosts import it here

STAGES: tuple[Stage, ...] = (
    media_ageing.stage,
    units.stage,
    reasoning_dropped.stage,
    fixed.stage,
    tail.stage,
    context.stage,
    history.stage,
    media_finish.stage,
    reasoning_sent.stage,
    alternate.stage,
    cache_marks.stage,
)
"""The stages of ``assemble``, in order; each takes the draft and returns a new one."""


def assemble(
    stored: StoredBranch, request: RequestSpec = NO_PARTS, *, target: Target
) -> AssembledRequest:
    """The request for ``stored.branch`` (root first) that ``request`` asks for, within
    ``target``'s window of its model.

    The system prompt is ``request.system`` when given; otherwise the branch's root message (no
    parent) when it is a stored ``system`` (or ``developer``) message, sent even when a summary
    covers it, since the summary replaces the conversation, not its instructions. A given
    ``system`` replaces the stored root prompt. Any other stored system message stays in place
    as history. ``request.model``, ``max_input_tokens`` and ``as_of`` were resolved by the
    caller into ``target`` and ``stored``; they are not read here.

    The summary is sent as a user message right after the system prompt: it is a record of the
    conversation rather than an operator instruction, it keeps the system prompt byte-stable
    across summaries, and it gives providers that require the first turn to be a user turn one.

    ``stored.missing_outputs`` lists the saved output files that no longer exist, so the
    placeholder of a cleared result can say so; ``text_only`` renders tool turns as plain text;
    ``cache_breakpoints`` adds Anthropic-style cache marks (``cache_marks``: the stable prefix
    and the newest messages, at most four); None (the default) marks for Anthropic models only.

    ``stored.omitted`` lists the oldest messages after the cutoff that the caller left out of
    the branch because no request within the window can hold them (see ``omittable``): the
    request is the same as with them passed, and they are reported as dropped.

    Media (``target.media_policy``, see ``core.counting.media``): parts older than the last
    ``keep_turns`` user turns, of a message recorded as aged, beyond the per-request caps, or in
    a text-only request are sent as placeholders; the byte guard then ages the oldest parts
    still sent in full until the request is within ``max_request_bytes``, and stored bytes are
    put back by its loader. Messages whose media all aged here are listed in ``media_aged``, to
    be recorded.

    ``stored.pinned`` lists the branch's pinned messages, root first (``core.request.pins``):
    those after the cutoff are sent in their place whatever the budget (with their units), the
    others right after the summary; all of them as stored, and counted before any history is
    fitted.
    """
    given = Given.of(stored, request, target)
    draft = start(given)
    for stage in STAGES:
        draft = stage(given, draft)
    return result(given, draft)
