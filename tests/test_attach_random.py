"""Seeded random trees of attaches and merges on a real database, each branch's request checked
against a simple reference: every item of the branch and of its attachments is sent exactly once
(none lost, none expanded twice), tool pairs are valid, and only a merge's commit has several
parents (the previous head and each peer's head)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from sqlalchemy import Engine

from recap.core.client import Recap
from recap.core.settings import get_settings

TOKEN = re.compile(r"\bitem\d+\b")
WINDOW = 1_000_000


class World:
    def __init__(self, recap: Recap, rng: random.Random) -> None:
        self.recap, self.rng, self.n = recap, rng, 0
        self.pointers: dict[int, tuple[str, int]] = {}  # open marker -> (source, leaf)
        self.children: dict[int, int] = {}
        self.commits: list[tuple[int, list[int]]] = []

    def tag(self) -> str:
        self.n += 1
        return f"item{self.n}"

    def turn(self, cid: str, parent: int | None = None) -> list[int]:
        if self.rng.random() < 0.5:
            batch = [
                {"role": "user", "content": f"ask {self.tag()}"},
                {"role": "assistant", "content": f"say {self.tag()}"},
            ]
        else:
            call = f"call_{self.n}"
            batch = [
                {"role": "user", "content": f"ask {self.tag()}"},
                {
                    "role": "assistant",
                    "content": f"calling {self.tag()}",
                    "tool_calls": [
                        {
                            "id": call,
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call, "content": f"result {self.tag()}"},
                {"role": "assistant", "content": f"done {self.tag()}"},
            ]
        ids = self.recap.add_many(cid, batch, parent_id=parent)
        return ids


def tokens_of(messages: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    for m in messages:
        found += TOKEN.findall(str(m.get("content") or ""))
    return found


def paired_tokens(messages: list[dict[str, Any]]) -> list[str]:
    """The reference's pair rule: a call is kept only with its result (and the result with it)."""
    answered = {m.get("tool_call_id") for m in messages if m["role"] == "tool"}
    made: set[str] = set()
    kept = []
    for m in messages:
        calls = [c["id"] for c in m.get("tool_calls") or []]
        if calls and not all(c in answered for c in calls):
            continue
        made.update(calls)
        if m["role"] == "tool" and m.get("tool_call_id") not in made:
            continue
        kept.append(m)
    return tokens_of(kept)


def reference(world: World, leaf: int) -> list[str]:
    own = world.recap.export("m", leaf=leaf)["messages"]
    seen = set(tokens_of(own))
    want = list(tokens_of(own))
    for message in own:
        if message["id"] in world.pointers:
            source, at = world.pointers[message["id"]]
            theirs = world.recap.export(source, leaf=at)["messages"]
            fresh = [m for m in theirs if not (set(tokens_of([m])) & seen)]
            got = paired_tokens(fresh)
            seen.update(got)
            want += got
    return want


def check_pairs(messages: list[dict[str, Any]]) -> None:
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, m
            open_calls.discard(m["tool_call_id"])
        else:
            assert not open_calls, (open_calls, m)
            open_calls = {c["id"] for c in m.get("tool_calls") or []}
    assert not open_calls


@pytest.mark.parametrize("seed", range(8))
def test_random_attaches_and_merges(sqlite_engine: Engine, seed: int) -> None:
    rng = random.Random(seed)
    recap = Recap(get_settings(), sqlite_engine)
    world = World(recap, rng)
    subs = [f"sub{i}" for i in range(3)]
    for sub in subs:
        recap.new(sub, model="gpt-4o", max_input_tokens=WINDOW)
        for _ in range(rng.randint(1, 3)):
            world.turn(sub)
    recap.new("m", model="gpt-4o", max_input_tokens=WINDOW)
    ends: list[int] = [world.turn("m")[-1]]  # message ids a turn ended at (fork points)
    head = ends[0]
    for _ in range(rng.randint(6, 12)):
        op = rng.random()
        if op < 0.3:  # a turn on the current branch, a sub growing now and then
            head = world.turn("m")[-1]
            ends.append(head)
            if rng.random() < 0.4:
                world.turn(rng.choice(subs))
        elif op < 0.5:  # fork from an earlier turn's end
            head = world.turn("m", parent=rng.choice(ends))[-1]
            ends.append(head)
        elif op < 0.8:  # attach a sub-agent's conversation
            sub = rng.choice(subs)
            try:
                made = recap.attach("m", source=sub)
            except Exception as exc:  # attached at that leaf already
                assert "attached already" in str(exc)
                continue
            world.pointers[made.open_id] = (sub, made.leaf)  # type: ignore[assignment]
            head = made.close_id
        else:  # merge another branch's end into this one
            path = {m["id"] for m in recap.export("m", leaf=head)["messages"]}
            peers = [e for e in ends if e not in path]
            if not peers:
                continue
            peer = rng.choice(peers)
            started = recap.merge("m", peers=[peer], instruction=f"merge {world.tag()}", leaf=head)
            world.pointers[started.attached[0].open_id] = ("m", peer)
            reply = recap.add("m", {"role": "assistant", "content": f"merged {world.tag()}"})
            world.commits.append((reply, [head, peer]))
            head = reply
            ends.append(head)
    for leaf in {head, *ends}:
        request = recap.assemble("m", leaf=leaf)
        sent = tokens_of(request.messages)
        want = reference(world, leaf)
        assert sorted(sent) == sorted(want), leaf  # none lost, none twice
        assert len(sent) == len(set(sent))
        check_pairs(request.messages)
    merges = recap.merges("m")
    assert [(m["commit"], m["parents"]) for m in merges] == world.commits
    assert all(len(m["parents"]) >= 2 for m in merges)
