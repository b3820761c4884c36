"""A check any test can run on an assembled request: its reported total covers what it carries.

``assert_counts_cover(request)`` counts, with plain tiktoken, every string the request's messages
carry (contents, reasoning and thinking text, signatures, call ids and arguments, names, roles)
plus its tool schemas, and asserts that the reported total is at least ``COVER_RATIO`` of that.
Media parts are left out of the plain count: their bytes are not text, and the breakdown counts
them by the provider's own rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from recap.core.counting import media, tokens
from recap.core.request.assembly import AssembledRequest

COVER_RATIO = 0.9  # the acceptance bound: Recap's count is never far below what is sent


def carried_strings(value: Any) -> Iterator[str]:
    """Every string inside a JSON value, media parts left out."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        if media.kind_of(value):
            return
        for item in value.values():
            yield from carried_strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from carried_strings(item)


def plain_count(
    messages: Sequence[Mapping[str, Any]],
    encoding: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> int:
    """tiktoken's count of every string the messages (and tool schemas) carry."""
    encoder = tokens.get_encoding(encoding)
    total = sum(len(encoder.encode_ordinary(text)) for text in carried_strings(list(messages)))
    if tools:
        total += len(encoder.encode_ordinary(json.dumps(list(tools))))
    return total


def assert_counts_cover(
    request: AssembledRequest | Mapping[str, Any],
    *,
    model: str = "gpt-4o-mini",
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> int:
    """Assert the request's reported total is at least ``COVER_RATIO`` of a plain tiktoken count
    of every string it carries; returns that plain count."""
    if isinstance(request, AssembledRequest):
        messages, total = request.messages, request.tokens.total
    else:
        messages, total = request["messages"], int(request["tokens"]["total"])
    plain = plain_count(messages, tokens.encoding_name_for(model), tools)
    assert total >= COVER_RATIO * plain, (
        f"reported total {total} is below {COVER_RATIO} x the {plain} tokens the request carries"
    )
    return plain
