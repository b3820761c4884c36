"""The Responses dialect sent natively (``workers.serve.native``): Recap's assembled chat
messages as a Responses request's input items, with each assistant message's provider items
back at their places; a Responses reply as the assistant message Recap stores (its text and
function calls readable, every other item a provider item); the reply's stream events made
from the whole reply."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from recap.core.request.native_openai import reply_message, responses_input
from recap.workers.serve import native

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


class ResponsesTurn(native.NativeTurn):
    """One Responses turn sent natively: the client's body (its tools, reasoning, text format
    and every other field pass on as given) and the model's string."""

    dialect = native.RESPONSES

    own_fields = OWN_FIELDS

    def request(self, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> bytes:
        """The upstream request for Recap's assembled ``messages``."""
        body = self.base_request()
        instructions, items = responses_input(messages, self.model, self.report, native.RawItem)
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
