"""Recall: the original behind a placeholder or a summary, for the host or for the model.

Every cleared tool result's placeholder names ``ref=m<id>`` and every summary message ends with
``ref=s<cutoff>`` (``core.request.refs``). ``recall`` returns what the reference stands for,
within ``RECAP_RECALL_MAX_CHARS`` a call (``offset`` pages through the rest):

- ``m<id>``: one stored message; a tool output or call arguments cut on the way in come back
  whole from their saved file while it exists;
- ``s<cutoff>``: the messages the summary up to that message covers, oldest first, as text;
- ``m<id>.<k>``: media part ``k`` of a message: its description, and the part itself with its
  bytes when they fit the cap.

``RECALL_TOOL`` is the ``recap_recall`` tool schema (OpenAI format; ``anthropic_tool()`` for the
Messages API) a host adds to its tools; ``answer`` turns one call's arguments into the text of
its result, errors included, so the model always gets an answer.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from recap.core.counting import media
from recap.core.counting.tokens import content_text
from recap.core.errors import InputError, NotFoundError, RecapError
from recap.core.request import refs
from recap.core.request.assembly import stored_prompt
from recap.core.settings import Settings
from recap.core.storage import compressed, outputs, reads, snapshot
from recap.core.storage.db import session_scope
from recap.core.values.records import Msg

RECALL_TOOL_NAME = "recap_recall"
SPAN_BATCH = 100  # messages of a span read per query
SHOWN_REF_CHARS = 40  # characters of a caller's reference an error repeats
NOTE = "\n[truncated: call recap_recall with offset {offset} to read on]"
NOTE_ROOM = len(NOTE.format(offset=10**20))  # an answer's page leaves room for its paging note
RECALL_DESCRIPTION = (
    "Get back the original content that was removed from this conversation to save context: "
    "a cleared tool output (its placeholder names ref=m<number>), the messages a summary covers "
    "(the summary names ref=s<number>), or a media part (ref=m<number>.<part>). Returns at most "
    "a page of text; pass next_offset as offset to read on."
)
RECALL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": RECALL_TOOL_NAME,
        "description": RECALL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "The reference, e.g. m42 or s17."},
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Characters to skip (the previous call's next_offset).",
                },
            },
            "required": ["ref"],
            "additionalProperties": False,
        },
    },
}


def tool_schema() -> dict[str, Any]:
    """The ``recap_recall`` tool in OpenAI's format (a copy, to add to a request's tools)."""
    return copy.deepcopy(RECALL_TOOL)


def anthropic_tool() -> dict[str, Any]:
    """The ``recap_recall`` tool in Anthropic's Messages format."""
    function = tool_schema()["function"]
    return {
        "name": function["name"],
        "description": function["description"],
        "input_schema": function["parameters"],
    }


@dataclass(frozen=True, kw_only=True)
class Recalled:
    """What a reference stands for, one page of it."""

    ref: str
    kind: str  # "message", "span" or "part"
    text: str
    offset: int
    next_offset: int | None  # where the next page starts; None when this is the end
    message_ids: list[int] = field(default_factory=list)
    part: dict[str, Any] | None = None  # a media part with its bytes, when they fit the cap

    @property
    def truncated(self) -> bool:
        return self.next_offset is not None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ref": self.ref,
            "kind": self.kind,
            "text": self.text,
            "offset": self.offset,
            "next_offset": self.next_offset,
            "truncated": self.truncated,
            "message_ids": list(self.message_ids),
        }
        if self.part is not None:
            out["part"] = self.part
        return out


def recall(
    engine: Engine,
    conversation_id: str,
    ref: str,
    settings: Settings,
    *,
    offset: int = 0,
    max_chars: int | None = None,
) -> Recalled:
    """The original ``ref`` names in the conversation, from ``offset`` characters on, at most
    ``max_chars`` (default ``RECAP_RECALL_MAX_CHARS``) of it. ``InputError`` for a malformed
    reference, ``NotFoundError`` for one the conversation does not have."""
    parsed = refs.parse_ref(ref)
    if parsed is None:
        raise InputError(
            f"{shown(ref)} is not a recall reference (expected m<id>, s<id> or m<id>.<k>)"
        )
    if offset < 0:
        raise InputError(f"the offset must not be negative, got {offset}")
    cap = settings.recall_max_chars if max_chars is None else max_chars
    if cap <= 0:
        raise InputError(f"the size cap must be positive, got {cap}")
    root = settings.output_dir
    if parsed.kind == refs.SPAN:
        return _span(engine, conversation_id, parsed, root, offset, cap)
    with session_scope(engine) as session:
        reads.conversation_head(session, conversation_id)
        rows = snapshot.load_contents(session, conversation_id, [parsed.message_id])
    message = rows.get(parsed.message_id)
    if message is None:
        raise NotFoundError(
            f"message {parsed.message_id} is not in conversation {conversation_id!r}"
        )
    if parsed.kind == refs.PART:
        return _part(message, parsed, root, cap)
    text = render(message, root)
    if offset and offset >= len(text):
        raise past_the_end(str(parsed), offset, len(text))
    page, following = _page(text, offset, cap)
    return Recalled(
        ref=str(parsed),
        kind=refs.MESSAGE,
        text=page,
        offset=offset,
        next_offset=following,
        message_ids=[message.id],
    )


def shown(ref: str) -> str:
    """A caller's reference as an error repeats it: quoted, a long one cut short."""
    if len(ref) <= SHOWN_REF_CHARS:
        return repr(ref)
    return f"{ref[:SHOWN_REF_CHARS]!r}… ({len(ref)} characters)"


def past_the_end(ref: str, offset: int, length: int) -> InputError:
    """An offset at or past the end of what ``ref`` stands for (nothing is left to read)."""
    return InputError(
        f"offset {offset} is past the end of {ref}, which is {length} characters "
        "(read from offset 0, or from a previous call's next_offset)"
    )


def render(message: Msg, root: Path) -> str:
    """One stored message as recall text: a header naming it, then its content as it arrived
    (a cut tool output or arguments put back from their saved file while it exists)."""
    body = outputs.restore(message, root)
    header = f"[{message.role} {refs.message_ref(message.id)}"
    if message.role == "tool":
        header += f" {message.name or 'tool'} call {message.tool_call_id or ''}"
    lines = [header + "]"]
    text = content_text(body.get("content"))
    if message.content_parts and media.has_media(message.content_parts):
        described = [
            f"[{refs.part_ref(message.id, index)}: {media.describe(part)}]"
            for index, part in enumerate(message.content_parts)
            if media.kind_of(part)
        ]
        text = "\n".join([text, *described]) if text else "\n".join(described)
    if text:
        lines.append(text)
    for call in body.get("tool_calls") or ():
        function = call.get("function") or {}
        lines.append(
            f"[tool call {call.get('id', '')}: {function.get('name', '')} "
            f"{function.get('arguments', '')}]"
        )
    return "\n".join(lines)


def _page(text: str, offset: int, cap: int) -> tuple[str, int | None]:
    page = text[offset : offset + cap]
    end = offset + len(page)
    return page, (end if end < len(text) else None)


def _part(message: Msg, parsed: refs.Ref, root: Path, cap: int) -> Recalled:
    parts = message.content_parts or ()
    index = parsed.part if parsed.part is not None else -1
    if not 0 <= index < len(parts) or not media.kind_of(parts[index]):
        raise NotFoundError(f"message {message.id} has no media part {index}")
    part = parts[index]
    description = media.describe(part)
    full: dict[str, Any] | None = media.strip_meta(part)
    stored = media.ref_of(part)
    if stored is not None:
        encoded = outputs.read_media(root, stored)
        if encoded is None:
            full = None
            description += " (its stored copy has expired)"
        else:
            full = media.strip_meta(
                media.with_data(part, media.data_field(media.meta_of(part), encoded))
            )
    if full is not None and len(json.dumps(full)) > cap:
        full = None
        description += f" (larger than the {cap}-character recall cap)"
    return Recalled(
        ref=str(parsed),
        kind=refs.PART,
        text=description,
        offset=0,
        next_offset=None,
        message_ids=[message.id],
        part=full,
    )


def _span(
    engine: Engine, conversation_id: str, parsed: refs.Ref, root: Path, offset: int, cap: int
) -> Recalled:
    """The messages a summary covers as text, read in batches only as far as the page needs."""
    cutoff = parsed.message_id
    with session_scope(engine) as session:
        reads.conversation_head(session, conversation_id)
        summaries = compressed.load_summaries(session, conversation_id)
        if not any(s.cutoff_message_id == cutoff for s in summaries):
            raise NotFoundError(
                f"conversation {conversation_id!r} has no summary up to message {cutoff}"
            )
        path = reads.branch_path(session.connection(), conversation_id, cutoff)
        first = snapshot.load_contents(session, conversation_id, path[:1])
    if first and stored_prompt([first[path[0]]]) is not None:
        path = path[1:]  # the system prompt is always sent: it is no part of the span
    pieces: list[tuple[int, str, int]] = []  # (start in the span's text, text, message id)
    position = 0  # where the next message's text starts
    whole = True  # every message of the span was read
    wanted = offset + cap
    for start in range(0, len(path), SPAN_BATCH):
        batch = path[start : start + SPAN_BATCH]
        with session_scope(engine) as session:
            rows = snapshot.load_contents(session, conversation_id, batch)
        for mid in batch:
            text = render(rows[mid], root) + "\n\n"
            if position + len(text) > offset:
                pieces.append((position, text, mid))
            position += len(text)
            if position >= wanted:
                whole = mid == path[-1]
                break
        if position >= wanted:
            break
    if not pieces:
        if offset:
            raise past_the_end(str(parsed), offset, position)
        return Recalled(
            ref=str(parsed),
            kind=refs.SPAN,
            text="",
            offset=offset,
            next_offset=None,
            message_ids=[],
        )
    begin = pieces[0][0]
    joined = "".join(text for _, text, _ in pieces)
    page = joined[offset - begin : offset - begin + cap]
    end = offset + len(page)
    more = not whole or end < position
    ids = [mid for _, _, mid in pieces]
    return Recalled(
        ref=str(parsed),
        kind=refs.SPAN,
        text=page,
        offset=offset,
        next_offset=end if more else None,
        message_ids=ids,
    )


def answer(
    engine: Engine,
    conversation_id: str,
    arguments: str | dict[str, Any],
    settings: Settings,
    *,
    max_chars: int | None = None,
) -> str:
    """The text of a ``recap_recall`` call's result, at most ``max_chars`` (default
    ``RECAP_RECALL_MAX_CHARS``) characters whatever it says: the recalled page with its paging
    note (the page leaves the note room), or one line saying why nothing came back (the model
    sees an answer either way, never an empty one)."""
    cap = settings.recall_max_chars if max_chars is None else max_chars
    page_cap = cap - NOTE_ROOM if cap > 2 * NOTE_ROOM else cap
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        if not isinstance(args, dict) or not isinstance(args.get("ref"), str):
            raise InputError('recap_recall takes {"ref": "m42"} (and optionally "offset")')
        offset = args.get("offset", 0)
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise InputError("the offset must be a whole number of characters")
        found = recall(
            engine, conversation_id, args["ref"], settings, offset=offset, max_chars=page_cap
        )
    except (RecapError, ValueError) as exc:
        return _capped(f"[recap_recall: {exc}]", cap)
    if not found.text:
        return _capped(f"[recap_recall: {found.ref} holds no text to recall]", cap)
    note = ""
    if found.next_offset is not None:
        note = NOTE.format(offset=found.next_offset)
    return _capped(found.text + note, cap)


def _capped(text: str, cap: int) -> str:
    """``text`` within ``cap`` characters (an error line cut short keeps its closing bracket)."""
    if len(text) <= cap:
        return text
    if text.startswith("[") and cap > 1:
        return text[: cap - 2] + "…]"
    return text[:cap]
