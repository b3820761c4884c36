"""The Responses dialect sent natively (``workers.serve.native``): Recap's assembled chat
messages as a Responses request's input items, with each assistant message's provider items
back at their places; a Responses reply as the assistant message Recap stores (its text and
function calls readable, every other item a provider item); the reply's stream events made
from the whole reply."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from recap.workers.serve import native

PROVIDER = "openai"
# The client's fields the request is not sent with as given: Recap sends its own input and
# instructions, keeps the state itself (``store: false`` upstream) and calls without a stream.
OWN_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "store",
        "stream",
        "stream_options",
        "metadata",
        "background",
        "conversation",
    }
)
ENCRYPTED = "reasoning.encrypted_content"
READABLE_TYPES = frozenset({"message", "function_call"})  # Recap reads these as messages
SYSTEM_ROLES = ("system", "developer")


class ResponsesTurn:
    """One Responses turn sent natively: the client's body (its tools, reasoning, text format
    and every other field pass on as given) and the model's string."""

    dialect = native.RESPONSES

    def __init__(self, body: Mapping[str, Any], model: str) -> None:
        self.body = body
        self.model = model
        self.report = native.Report()

    def request(self, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> bytes:
        """The upstream request for Recap's assembled ``messages``."""
        self.report = native.Report()
        body: dict[str, Any] = {k: v for k, v in self.body.items() if k not in OWN_FIELDS}
        body["model"] = native.upstream_name(self.model)
        instructions, items = self.input_items(messages)
        if instructions:
            body["instructions"] = instructions
        body["input"] = items
        body["store"] = False  # Recap holds the conversation: every item comes back inline
        include = [str(v) for v in body.get("include") or () if v != ENCRYPTED]
        body["include"] = [*include, ENCRYPTED]
        if isinstance(params.get("max_tokens"), int):  # the client's limit, cut to the room
            body["max_output_tokens"] = params["max_tokens"]
        for key in ("prompt_cache_key", "prompt_cache_retention"):
            if key in params and key not in body:
                body[key] = params[key]
        return native.encode(body)

    def input_items(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[Any]]:
        """The instructions (the leading system messages) and the input items."""
        start, system = 0, []
        while start < len(messages) and messages[start].get("role") in SYSTEM_ROLES:
            system.append(text_of(messages[start].get("content")))
            start += 1
        items: list[Any] = []
        for message in messages[start:]:
            role = message.get("role")
            if role == "assistant":
                items += native.placed(message, readable(message), self.model, self.report)
            elif role == "tool":
                output = text_of(message.get("content"))
                call_id = message.get("tool_call_id")
                items.append({"type": "function_call_output", "call_id": call_id, "output": output})
            else:
                items.append({"role": role, "content": input_content(message.get("content"))})
        return "\n\n".join(t for t in system if t), items

    def reply_message(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The assistant message stored for a Responses reply (see the module's docstring)."""
        return reply_message(data, self.model)

    def usage(self, data: Mapping[str, Any]) -> tuple[int, int, int] | None:
        usage = data.get("usage")
        if not isinstance(usage, Mapping):
            return None
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        details = usage.get("input_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        return prompt, completion, cached if isinstance(cached, int) else 0

    def answer(self, data: Mapping[str, Any], response_id: str, store: bool) -> dict[str, Any]:
        """The reply as the client gets it: the upstream's object under Recap's response id."""
        return {**data, "id": response_id, "store": store}

    def events(self, answer: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """The stream events of a whole reply (``answer``), as the Responses API sends them."""
        yield from response_events(answer)


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def input_content(content: Any) -> Any:
    """A user (or system) message's content as Responses input content."""
    if not isinstance(content, list):
        return content if isinstance(content, str) else ""
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append({"type": "input_text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, Mapping) else image
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
        elif kind == "file":
            file = part.get("file") or {}
            parts.append({"type": "input_file", **{k: v for k, v in file.items() if v}})
    return parts


def readable(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's readable items in the order a reply gives them: its text, then
    its function calls."""
    items: list[dict[str, Any]] = []
    text = text_of(message.get("content"))
    if text:
        items.append({"role": "assistant", "content": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
            }
        )
    return items


def reply_message(data: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A Responses reply's output as one assistant message: its text, its function calls,
    its reasoning summary as ``reasoning_content`` (readable, never sent back), every other
    item a provider item at its place, reasoning items with the provider's reasoning tokens
    shared among them."""
    output = data.get("output")
    output = output if isinstance(output, list) else []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    kept: list[dict[str, Any]] = []
    reasoning_items = [i for i in output if isinstance(i, Mapping) and i.get("type") == "reasoning"]
    shares = reasoning_shares(data.get("usage"), len(reasoning_items))
    for at, item in enumerate(output):
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "message":
            texts += message_texts(item)
        elif kind == "function_call":
            calls.append(chat_call(item))
        elif kind == "reasoning":
            summary = summary_text(item)
            thoughts.append(summary)
            if item.get("encrypted_content"):
                share = shares.pop(0) if shares else None
                kept.append(
                    native.provider_item(
                        PROVIDER, model, item, at, kind="reasoning", readable=summary, tokens=share
                    )
                )
        else:  # compaction, built-in tool calls and their results: opaque to Recap
            kept.append(native.provider_item(PROVIDER, model, item, at, kind="other"))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if message["content"] is None and not calls:
        message["content"] = ""
    thought = "\n".join(t for t in thoughts if t)
    if thought:
        message["reasoning_content"] = thought
    if kept:
        message["provider_items"] = kept
    return message


def message_texts(item: Mapping[str, Any]) -> list[str]:
    """The texts (and refusals) of an output message."""
    out = []
    for part in item.get("content") or ():
        if isinstance(part, Mapping) and part.get("type") == "output_text":
            out.append(str(part.get("text", "")))
        elif isinstance(part, Mapping) and part.get("type") == "refusal":
            out.append(str(part.get("refusal", "")))
    return out


def chat_call(item: Mapping[str, Any]) -> dict[str, Any]:
    """A ``function_call`` item as a chat-completions tool call."""
    function = {"name": str(item.get("name") or ""), "arguments": str(item.get("arguments") or "")}
    return {"id": str(item.get("call_id") or ""), "type": "function", "function": function}


def summary_text(item: Mapping[str, Any]) -> str:
    parts = [*(item.get("summary") or ()), *(item.get("content") or ())]
    return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping))


def reasoning_shares(usage: Any, count: int) -> list[int]:
    """The provider's reasoning tokens shared among ``count`` reasoning items (none when the
    usage does not give them)."""
    details = usage.get("output_tokens_details") if isinstance(usage, Mapping) else None
    total = details.get("reasoning_tokens") if isinstance(details, Mapping) else None
    if not isinstance(total, int) or total <= 0 or count == 0:
        return []
    return [total // count + (1 if n < total % count else 0) for n in range(count)]


def response_events(answer: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """A whole response as its stream: created, in progress, each output item added (a
    message's text as one delta, a call's arguments as one), done, then completed."""
    number = 0

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal number
        number += 1
        return {"type": kind, "sequence_number": number - 1, **fields}

    started = {**answer, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(answer.get("output") or ()):
        if not isinstance(item, Mapping):
            continue
        item_id = item.get("id")
        where = {"output_index": index, "item_id": item_id}
        if item.get("type") == "message":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for number_in, part in enumerate(item.get("content") or ()):
                at = {**where, "content_index": number_in}
                empty = {**part, "text": ""} if "text" in part else part
                yield event("response.content_part.added", **at, part=empty)
                if part.get("type") == "output_text":
                    text = str(part.get("text", ""))
                    yield event("response.output_text.delta", **at, delta=text, logprobs=[])
                    yield event("response.output_text.done", **at, text=text, logprobs=[])
                yield event("response.content_part.done", **at, part=part)
        elif item.get("type") == "function_call":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            arguments = str(item.get("arguments") or "")
            yield event("response.function_call_arguments.delta", **where, delta=arguments)
            yield event("response.function_call_arguments.done", **where, arguments=arguments)
        else:
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=answer)
