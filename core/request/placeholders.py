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


def cleared_placeholder(
    *,
    tool_name: str | None,
    call_id: str,
    tokens: int | str,
    output_path: str | None = None,
    file_exists: bool = True,
    ref: str | None = None,
) -> str:
    """What a cleared tool result says instead of its output: the tool, the call, the size that
    was there, its recall reference (``ref``, when given), and how to get it back (the saved
    file, or that it has expired)."""
    named = _REF.format(ref=ref) if ref else ""
    head = _HEAD.format(
        tool=tool_name or DEFAULT_TOOL_NAME, call_id=call_id, tokens=tokens, ref=named
    )
    if output_path and file_exists:
        return head + _SAVED.format(path=output_path)
    if output_path:
        return head + _EXPIRED.format(path=output_path)
    return head + _NOT_SAVED


def placeholder_frames() -> tuple[str, ...]:
    """Every wording of the placeholder with its variable parts left empty (the reference's frame
    included): what the token bound of a placeholder is computed from
    (``core.decision.toolresults.placeholder_tokens_bound``, which adds the reference's value)."""
    head = _HEAD.format(tool="", call_id="", tokens="", ref=_REF.format(ref=""))
    return (
        head + _NOT_SAVED,
        head + _SAVED.format(path=""),
        head + _EXPIRED.format(path=""),
    )
