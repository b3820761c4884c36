"""Validation of OpenAI-format messages on the way in (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from recap.core.counting import media
from recap.core.errors import InputError
from recap.core.request import shape
from recap.core.values import limits

KNOWN_KEYS = {"role", "content", "tool_calls", "tool_call_id", "name", "id"}
# Keys starting with this are Recap's own (file paths, sizes): refused in input, never stored.
DERIVED_PREFIX = "_"


def check_message(message: Any, where: str) -> dict[str, Any]:
    """One message: storable on both databases, shaped as providers accept it
    (``core.request.shape``), its media parts and tool calls well-formed."""
    if not isinstance(message, Mapping):
        raise InputError(f"{where}: a message must be a JSON object")
    _refuse_derived(message, where)
    _check_storable(message, where)  # first: it bounds the nesting the walks below follow
    shape.check_shape(message, where)
    role = message.get("role")
    content = message.get("content")
    if isinstance(content, list):
        media.check_parts(content, where)
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise InputError(f"{where}: only assistant messages may carry tool_calls")
        if not isinstance(calls, list):
            raise InputError(f"{where}: tool_calls must be a list")
        for index, call in enumerate(calls):
            _check_call(call, f"{where} tool_calls[{index}]")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InputError(f"{where}: a tool message needs a tool_call_id")
    return dict(message)


def _check_storable(message: Mapping[str, Any], where: str) -> None:
    """What both databases can hold: short names, text without NUL, finite numbers."""
    for key in ("tool_call_id", "name"):
        limits.check_name(message.get(key), f"{where}: {key}", optional=True)
    for key, value in message.items():
        limits.check_value(value, f"{where}: {key}")


def _refuse_derived(message: Mapping[Any, Any], where: str) -> None:
    """Fields Recap derives itself are never taken from input: one error naming the first."""
    for key in message:
        if not isinstance(key, str):
            raise InputError(f"{where}: field names must be strings, got {key!r}")
        if key.startswith(DERIVED_PREFIX):
            raise InputError(
                f"{where}: field {key!r} is reserved for what Recap derives itself "
                f"(keys starting with {DERIVED_PREFIX!r} are refused)"
            )


def _check_call(call: Any, where: str) -> None:
    if not isinstance(call, Mapping) or not isinstance(call.get("id"), str) or not call["id"]:
        raise InputError(f"{where}: a tool call needs a string id")
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InputError(f"{where}: a tool call needs function.name")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        raise InputError(f"{where}: function.arguments must be a JSON string")


def check_tool_pairing(
    messages: Iterable[Mapping[str, Any]],
    where: str,
    open_calls: Mapping[str, int] | Iterable[str] = (),
    *,
    first_index: int = 0,
) -> Counter[str]:
    """Every tool message answers an open call: one made by an earlier assistant message (or
    open before ``messages``) and not answered yet. Open calls are counted per id, so an id a
    server reuses every turn (``call_0``) pairs again once its earlier call was answered.
    Returns the calls still open after ``messages`` (to go on from with the messages after
    them: ``first_index`` numbers the first of those in errors)."""
    pending = Counter(open_calls)
    for index, message in enumerate(messages, first_index):
        if message.get("role") == "assistant":
            pending.update(str(call["id"]) for call in message.get("tool_calls") or ())
        elif message.get("role") == "tool":
            call_id = str(message.get("tool_call_id"))
            if pending[call_id] <= 0:
                label = f"{where} message {index}" if where else f"message {index}"
                raise InputError(
                    f"{label}: tool result {call_id!r} answers no earlier call that is still open"
                )
            pending[call_id] -= 1
    return pending


def calls_needed(messages: Iterable[Mapping[str, Any]]) -> Counter[str]:
    """Per call id, how many results of ``messages`` must answer calls made before them (the
    rest answer calls made earlier in ``messages``)."""
    made: Counter[str] = Counter()
    needed: Counter[str] = Counter()
    for message in messages:
        if message.get("role") == "assistant":
            made.update(str(call["id"]) for call in message.get("tool_calls") or ())
        elif message.get("role") == "tool":
            call_id = str(message.get("tool_call_id"))
            if made[call_id] > 0:
                made[call_id] -= 1
            else:
                needed[call_id] += 1
    return needed


class Step(NamedTuple):
    """What pairing needs of one stored message: no content."""

    role: str
    tool_call_id: str | None
    call_ids: Sequence[str]


def open_calls_from_tail(
    newest_first: Iterable[Step], needed: Mapping[str, int], *, reached_root: bool
) -> dict[str, int] | None:
    """The open calls of the ``needed`` ids on a branch, from its newest messages back.

    Walking back, a call id's open count is at least (calls seen - results seen), since no stored
    prefix answers more calls than it made; it is exact once the walk reached the root. Returns
    each needed id's open count (capped at what is needed) as soon as every id has enough, the
    exact counts when ``reached_root``, or None when the messages walked cannot tell.
    """
    balance: Counter[str] = Counter()  # calls minus results seen so far, per needed id
    unmet = {call_id for call_id, count in needed.items() if count > 0}
    for step in newest_first:
        if not unmet:
            break
        if step.role == "tool" and step.tool_call_id in unmet:
            balance[step.tool_call_id] -= 1
        for call_id in step.call_ids:
            if call_id in unmet:
                balance[call_id] += 1
                if balance[call_id] >= needed[call_id]:
                    unmet.discard(call_id)
    if unmet and not reached_root:
        return None
    return {call_id: max(0, min(balance[call_id], count)) for call_id, count in needed.items()}


def check_record(record: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """Every message of one imported conversation, checked, with its tool pairs checked."""
    messages = [check_message(m, f"{where} message {i}") for i, m in enumerate(record["messages"])]
    check_tool_pairing(messages, where)
    if record.get("id") is not None:
        limits.check_name(str(record["id"]), f"{where}: id")
    for key, value in record.items():
        if key not in ("id", "messages"):
            limits.check_value(value, f"{where}: {key}")
    return messages


def parse_json_line(line: str, where: str) -> dict[str, Any]:
    """One line of an import file: a JSON object with a ``messages`` list."""
    record = limits.loads(line, where)
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise InputError(f"{where}: expected an object with a 'messages' list")
    shape.check_conversation_id(record.get("id"), f"{where}: 'id'")
    return record
