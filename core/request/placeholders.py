"""The fixed text a cleared tool result renders as (pure: the same state gives the same bytes)."""

from __future__ import annotations

DEFAULT_TOOL_NAME = "tool"  # what a result without a tool name is called

_HEAD = (
    "[Cleared: the output of {tool} (call {call_id}, {tokens} tokens{ref}) was removed to save "
    "context."
)
_REF = ", ref={ref}"  # the recall reference (core.request.refs), when the caller names one
_SAVED = " The full output is saved at {path}; read that file if you need it.]"
_EXPIRED = " Its saved full output ({path}) has expired; run the tool again if you need it.]"
_NOT_SAVED = " Run the tool again if you need its output.]"
# when the request offers the recall tool (``recall=True``), the ways back name it instead
RECALL_TOOL = "recap_recall"
_RECALL_EXPIRED = (
    " Its saved full output ({path}) has expired; call " + RECALL_TOOL + " with its ref if you "
    "need it.]"
)
_RECALL_NOT_SAVED = " Call " + RECALL_TOOL + " with its ref if you need its output.]"


def cleared_placeholder(
    *,
    tool_name: str | None,
    call_id: str,
    tokens: int | str,
    output_path: str | None = None,
    file_exists: bool = True,
    ref: str | None = None,
    recall: bool = False,
) -> str:
    """What a cleared tool result says instead of its output: the tool, the call, the size that
    was there, its recall reference (``ref``, when given), and how to get it back (the saved
    file, or that it has expired). With ``recall`` (the request offers ``recap_recall`` and
    ``ref`` is given) the way back without a file is that tool, not running the tool again;
    without it the bytes are the same as ever (a cached prefix)."""
    named = _REF.format(ref=ref) if ref else ""
    head = _HEAD.format(
        tool=tool_name or DEFAULT_TOOL_NAME, call_id=call_id, tokens=tokens, ref=named
    )
    if output_path and file_exists:
        return head + _SAVED.format(path=output_path)
    recalled = recall and bool(ref)
    if output_path:
        return head + (_RECALL_EXPIRED if recalled else _EXPIRED).format(path=output_path)
    return head + (_RECALL_NOT_SAVED if recalled else _NOT_SAVED)


def placeholder_frames() -> tuple[str, ...]:
    """Every wording of the placeholder with its variable parts left empty (the reference's frame
    included): what the token bound of a placeholder is computed from
    (``core.decision.toolresults.placeholder_tokens_bound``, which adds the reference's value).
    The wordings without a file are the longer of the plain one and the one naming the recall
    tool, so the bound holds for both."""
    head = _HEAD.format(tool="", call_id="", tokens="", ref=_REF.format(ref=""))
    return (
        head + max(_NOT_SAVED, _RECALL_NOT_SAVED, key=len),
        head + _SAVED.format(path=""),
        head + max(_EXPIRED, _RECALL_EXPIRED, key=len).format(path=""),
    )


# --- the aged stage: a tool result sent as its head and tail, old call arguments shortened ------

_AGED_NOTE = "\n[... {left} characters of this output are left out here to save context (ref={ref}"
_AGED_SAVED = "). The full output is saved at {path}; read that file if you need it.]\n"
_AGED_EXPIRED = "). Its saved full output ({path}) has expired; run the tool again for the rest.]\n"
_AGED_NOT_SAVED = "). Run the tool again if you need the rest.]\n"
_ARGUMENTS_NOTE = " [shortened to save context, ref={ref}]"


def aged_note(
    *, left: int | str, ref: str, output_path: str | None = None, file_exists: bool = True
) -> str:
    """What an aged tool result says between its head and its tail: how much is left out, its
    recall reference (``ref`` is ``m<id>``), and where the whole output is (the saved file, or
    that it has expired)."""
    head = _AGED_NOTE.format(left=left, ref=ref)
    if output_path and file_exists:
        return head + _AGED_SAVED.format(path=output_path)
    if output_path:
        return head + _AGED_EXPIRED.format(path=output_path)
    return head + _AGED_NOT_SAVED


def aged_note_frames() -> tuple[str, ...]:
    """Every wording of the aged note with its variable parts left empty: what the token bound
    of an aged result is computed from (``core.decision.toolresults.aged_tokens_bound``)."""
    head = _AGED_NOTE.format(left="", ref="")
    return (
        head + _AGED_NOT_SAVED,
        head + _AGED_SAVED.format(path=""),
        head + _AGED_EXPIRED.format(path=""),
    )


def arguments_note(ref: str) -> str:
    """What a shortened argument of an old tool call ends with: its recall reference (the
    assistant message's ``m<id>``)."""
    return _ARGUMENTS_NOTE.format(ref=ref)
