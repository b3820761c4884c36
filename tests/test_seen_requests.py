"""A resent history is checked only past what the conversation's last request held: the reused
checks, hashes and open tool calls give the same answer as checking the request afresh.

Seeded random histories of text, tool calls and results (some results answering no open call,
some ids reused turn after turn), each request growing, repeating or cutting the last one."""

from __future__ import annotations

import random
from typing import Any

import pytest

from recap.core.errors import InputError
from recap.core.storage.requests import Seen, checked_and_hashed

ROUNDS = 300


def _message(rng: random.Random, turn: int) -> dict[str, Any]:
    roll = rng.random()
    call_id = f"call_{rng.randrange(3)}"  # ids reused, as some servers reuse call_0
    if roll < 0.3:
        call = {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if roll < 0.55:
        return {"role": "tool", "tool_call_id": call_id, "content": f"out {turn}"}
    return {"role": rng.choice(["user", "assistant"]), "content": f"text {turn} {rng.random()}"}


def _answer(messages: list[dict[str, Any]], previous: Seen | None) -> Any:
    try:
        seen = checked_and_hashed(messages, previous)
    except InputError as exc:
        return ("refused", str(exc))
    return ("seen", seen.checked, seen.hashes, +seen.open_calls)


@pytest.mark.parametrize("seed", range(6))
def test_reused_checks_answer_as_a_fresh_check(seed: int) -> None:
    rng = random.Random(seed)
    history: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    previous: Seen | None = None
    refused = 0
    for turn in range(ROUNDS):
        roll = rng.random()
        if roll < 0.7:
            request = [*history, *(_message(rng, turn) for _ in range(rng.randrange(1, 3)))]
        elif roll < 0.85:
            request = list(history)
        else:
            request = history[: rng.randrange(1, len(history) + 1)]
        fresh, reused = _answer(request, None), _answer(request, previous)
        assert reused == fresh, (seed, turn)
        if fresh[0] == "seen":
            previous = checked_and_hashed(request, previous)
            history = request
        else:
            refused += 1
    assert 0 < refused < ROUNDS
