"""Anthropic prompt caching: what Recap's cache marks save over marks on the stable prefix only.

Every shared agent run is replayed one request per step (the branch up to each assistant
message, assembled for an Anthropic model at a window that holds it whole), and each request is
priced as Anthropic bills it: the longest prefix a mark of an earlier request wrote, found at a
mark of this one or up to ``LOOKBACK`` blocks before it, is read at 0.1x; from there to this
request's last mark is written at 1.25x; what follows the last mark is paid in full. Every mark's
prefix is then cached for later requests (all within the cache lifetime: one step follows the
next).

- ``anthropic_cache_cost_vs_prefix_marks``: the cost with Recap's marks (the stable prefix and the
  two newest messages) over the cost with marks on the stable prefix only (bound 0.5);
- ``anthropic_cache_cost_vs_oracle``: the cost with Recap's marks over an ideal cache, a lower
  bound of every placement of marks: each request reads all it shares with the one before at
  0.1x and writes only what is new at 1.25x.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from bench import Figure
from bench.data import load_all
from recap.core.counting import tokens
from recap.core.request import render
from recap.core.request.assembly import StoredBranch, Target, assemble
from recap.core.values.records import Msg
from recap.core.values.request import RequestSpec

MODEL = "claude-3-5-sonnet-20241022"
WINDOW = 1_000_000  # the whole run fits: the figure is about marks, not truncation
READ, WRITE = 0.1, 1.25  # Anthropic's cache prices against the base input price
LOOKBACK = 20  # blocks before a mark where the provider still looks for a cached prefix


def _branch(messages: Sequence[dict[str, Any]]) -> list[Msg]:
    encoding = tokens.encoding_name_for(MODEL)
    return [
        Msg(
            id=index + 1,
            parent_id=index or None,
            role=message["role"],
            content=tokens.content_text(message.get("content")),
            tokens=tokens.count_message(message, encoding),
            tool_calls=tuple(message.get("tool_calls") or ()),
            tool_call_id=message.get("tool_call_id"),
            name=message.get("name"),
        )
        for index, message in enumerate(messages)
    ]


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """The message without its cache mark: what the provider hashes a prefix of."""
    content = message.get("content")
    if isinstance(content, list):
        content = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
        if len(content) == 1 and content[0].get("type") == "text":
            content = content[0]["text"]
    return {**message, "content": content}


def _prefixes(messages: Sequence[dict[str, Any]]) -> tuple[list[str], list[int]]:
    """Each prefix's key and its tokens (tools and system first, as the provider orders them)."""
    encoding = tokens.encoding_name_for(MODEL)
    digest = hashlib.blake2b(digest_size=16)
    keys: list[str] = []
    sizes: list[int] = []
    total = 0
    for message in messages:
        plain = _plain(message)
        digest.update(json.dumps(plain, sort_keys=True).encode())
        keys.append(digest.copy().hexdigest())
        total += tokens.count_message(plain, encoding)
        sizes.append(total)
    return keys, sizes


def _marks(messages: Sequence[dict[str, Any]]) -> list[int]:
    return [
        i
        for i, m in enumerate(messages)
        if isinstance(m.get("content"), list)
        and m["content"]
        and "cache_control" in m["content"][-1]
    ]


def _price(requests: Sequence[list[dict[str, Any]]], marks_of: Any) -> float:
    """What the requests cost in base-price tokens with the marks ``marks_of`` places."""
    cached: set[str] = set()
    cost = 0.0
    for messages in requests:
        keys, sizes = _prefixes(messages)
        marks = marks_of(messages)
        total = sizes[-1]
        hit = 0
        for mark in marks:
            for position in range(mark, max(mark - LOOKBACK, -1), -1):
                if keys[position] in cached:
                    hit = max(hit, sizes[position])
                    break
        written_to = sizes[marks[-1]] if marks else 0
        cost += READ * hit + WRITE * max(written_to - hit, 0) + (total - max(written_to, hit))
        cached.update(keys[mark] for mark in marks)
    return cost


def _ideal(requests: Sequence[list[dict[str, Any]]]) -> float:
    """Each request reads what it shares with the previous one and writes the rest."""
    cost = 0.0
    previous: set[str] = set()
    for messages in requests:
        keys, sizes = _prefixes(messages)
        shared = max((sizes[i] for i, key in enumerate(keys) if key in previous), default=0)
        cost += READ * shared + WRITE * (sizes[-1] - shared)
        previous = set(keys)
    return cost


def _requests(record: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """One request per step: the branch before each assistant message, marked by Recap."""
    messages = record["messages"]
    branch = _branch(messages)
    out = []
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and index:
            request = assemble(
                StoredBranch(branch=branch[:index]),
                RequestSpec(cache_breakpoints=True),
                target=Target(model=MODEL, window=WINDOW, safety_margin=0.0),
            )
            out.append(request.messages)
    return out


def _prefix_only(messages: Sequence[dict[str, Any]]) -> list[int]:
    return [0] if messages and messages[0].get("role") == "system" else []


def run() -> list[Figure]:
    recap = prefix = ideal = 0.0
    for record in load_all():
        requests = _requests(record)
        if not requests:
            continue
        plain = [[_plain(m) for m in messages] for messages in requests]
        recap += _price(requests, _marks)
        prefix += _price(
            [[render.with_cache_mark(m) if i in _prefix_only(ms) else m for i, m in enumerate(ms)]
             for ms in plain],
            _prefix_only,
        )  # fmt: skip
        ideal += _ideal(plain)
    return [
        Figure(
            "anthropic_cache_cost_vs_prefix_marks",
            round(recap / prefix, 4),
            "<= 0.5",
            "Anthropic-priced cost of every shared run, one request per step: Recap's marks "
            "(stable prefix and the two newest messages) over marks on the stable prefix only",
        ),
        Figure(
            "anthropic_cache_cost_vs_oracle",
            round(recap / ideal, 4),
            "",
            "the same cost over an ideal cache (each request reads all it shares with the one "
            "before, writes only what is new): a lower bound of every placement of four marks",
        ),
    ]
