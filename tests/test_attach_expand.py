"""Attachments expanded into a branch (``core.request.attach``) as plain values: the markers,
provenance, once-only expansion, the fallback item, tool pairs and the summary cutoff kept out
of a block; and seeded random trees of attaches checked against a simple reference."""

from __future__ import annotations

import random
from typing import Any

import pytest

from recap.core.request.attach import (
    close_text,
    expand,
    fallback_text,
    open_text,
    outside_spans,
    paired,
)
from recap.core.values.attach import Pointer, Source
from recap.core.values.records import Msg


def msg(mid: int, role: str = "user", content: str | None = None, **kw: Any) -> Msg:
    return Msg(mid, None, role, content if content is not None else f"m{mid}", 5, **kw)


def call(mid: int, cid: str) -> Msg:
    return msg(mid, "assistant", "", tool_calls=({"id": cid, "function": {"name": "f"}},))


def result(mid: int, cid: str) -> Msg:
    return msg(mid, "tool", f"r{mid}", tool_call_id=cid)


def marks(open_id: int, source: str, leaf: int | None) -> list[Msg]:
    return [
        msg(open_id, content=open_text(source, leaf)),
        msg(open_id + 1, content=close_text(source)),
    ]


def loader(sources: dict[tuple[str, int | None], Source]) -> Any:
    return lambda p: sources.get((p.source, p.leaf))


SUB = [msg(101), call(102, "c1"), result(103, "c1"), msg(104, "assistant", "done")]

CASES: list[tuple[str, Any, Any, Any, list[int], list[str]]] = [
    # name, branch, pointers, sources, expected ids, expected provenance values
    (
        "markers around the items",
        [msg(1), *marks(2, "sub", 104), msg(4)],
        {2: Pointer(2, 3, "sub", 104)},
        {("sub", 104): Source(SUB)},
        [1, 2, 101, 102, 103, 104, 3, 4],
        ["sub:101", "sub:102", "sub:103", "sub:104"],
    ),
    (
        "fallback: one item, close dropped",
        [msg(1), *marks(2, "gone", 9), msg(4)],
        {2: Pointer(2, 3, "gone", 9)},
        {},
        [1, 2, 4],
        [],
    ),
    (
        "attached twice: the second brings only what is new",
        [*marks(1, "sub", 103), *marks(3, "sub", 104)],
        {1: Pointer(1, 2, "sub", 103), 3: Pointer(3, 4, "sub", 104)},
        {("sub", 103): Source(SUB[:3]), ("sub", 104): Source(SUB)},
        [1, 101, 102, 103, 2, 3, 104, 4],
        ["sub:101", "sub:102", "sub:103", "sub:104"],
    ),
    (
        "a branch of the same conversation: the shared prefix is not brought again",
        [msg(1), msg(2), *marks(10, "self", 6)],
        {10: Pointer(10, 11, "self", 6)},
        {("self", 6): Source([msg(1), msg(2), msg(5), msg(6, "assistant")])},
        [1, 2, 10, 5, 6, 11],
        ["self:5", "self:6"],
    ),
    (
        "a call whose result the block lacks is left out",
        [*marks(1, "sub", 102)],
        {1: Pointer(1, 2, "sub", 102)},
        {("sub", 102): Source(SUB[:2])},
        [1, 101, 2],
        ["sub:101"],
    ),
    (
        "nested: the source's own attachment expanded in turn",
        [*marks(1, "mid", 52)],
        {1: Pointer(1, 2, "mid", 52)},
        {
            ("mid", 52): Source(
                [*marks(50, "sub", 104), msg(52)], {50: Pointer(50, 51, "sub", 104)}
            ),
            ("sub", 104): Source(SUB),
        },
        [1, 50, 101, 102, 103, 104, 51, 52, 2],
        ["mid:50", "sub:101", "sub:102", "sub:103", "sub:104", "mid:51", "mid:52"],
    ),
    (
        "a system message of the source is not brought",
        [*marks(1, "sub", 3)],
        {1: Pointer(1, 2, "sub", 3)},
        {("sub", 3): Source([msg(200, "system"), msg(3)])},
        [1, 3, 2],
        ["sub:3"],
    ),
]


@pytest.mark.parametrize(
    ("name", "branch", "pointers", "sources", "ids", "prov"), CASES, ids=[c[0] for c in CASES]
)
def test_expansion_table(
    name: str, branch: Any, pointers: Any, sources: Any, ids: list[int], prov: list[str]
) -> None:
    out = expand(branch, pointers, loader(sources))
    assert [m.id for m in out.branch] == ids
    assert [out.provenance[m.id] for m in out.branch if m.id in out.provenance] == prov


def test_fallback_item_text_never_the_source() -> None:
    out = expand([*marks(1, "gone", 7)], {1: Pointer(1, 2, "gone", 7)}, loader({}))
    assert len(out.branch) == 1
    assert out.branch[0].role == "user"
    assert out.branch[0].content == fallback_text("gone")
    assert out.blocks[0].fallback and out.spans() == ()


def test_locked_items_named() -> None:
    out = expand(
        [*marks(1, "sub", 104)],
        {1: Pointer(1, 2, "sub", 104, "merge", True)},
        loader({("sub", 104): Source(SUB)}),
    )
    assert out.locked == frozenset({101, 102, 103, 104})


def test_same_branch_read_twice_expands_the_same() -> None:
    """A later request carries the attachment at the same place, not again."""
    branch = [msg(1), *marks(2, "sub", 104), msg(4), msg(5, "assistant")]
    pointers = {2: Pointer(2, 3, "sub", 104)}
    first = expand(branch[:4], pointers, loader({("sub", 104): Source(SUB)}))
    later = expand(branch, pointers, loader({("sub", 104): Source(SUB)}))
    assert [m.id for m in later.branch][: len(first.branch)] == [m.id for m in first.branch]
    assert sorted(m.id for m in later.branch).count(101) == 1


CUTS = [
    # ids, spans, cutoff, expected
    ([1, 2, 101, 102, 3, 4], [(2, 3)], 101, 1),
    ([1, 2, 101, 102, 3, 4], [(2, 3)], 2, 1),
    ([1, 2, 101, 102, 3, 4], [(2, 3)], 102, 1),
    ([1, 2, 101, 102, 3, 4], [(2, 3)], 3, 3),
    ([1, 2, 101, 102, 3, 4], [(2, 3)], 1, 1),
    ([2, 101, 3, 4], [(2, 3)], 101, None),
    ([1, 2, 101, 3, 4], [], 101, 101),
]


@pytest.mark.parametrize(("ids", "spans", "cutoff", "expected"), CUTS)
def test_summary_cutoff_outside_blocks(
    ids: list[int], spans: Any, cutoff: int, expected: int | None
) -> None:
    assert outside_spans(ids, spans, cutoff) == expected


# --- seeded random trees against a reference -------------------------------------------------


def random_world(rng: random.Random) -> tuple[dict[str, list[Msg]], dict[str, dict[int, Pointer]]]:
    """A few conversations, each a chain of turns (user, tool step, assistant) and attach
    markers naming earlier conversations at a prefix of their chain."""
    next_id = iter(range(1, 100_000))
    convs: dict[str, list[Msg]] = {}
    ptrs: dict[str, dict[int, Pointer]] = {}
    for c in range(rng.randint(2, 6)):
        name = f"c{c}"
        chain: list[Msg] = []
        pointers: dict[int, Pointer] = {}
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            if kind < 0.3 and convs:
                src = rng.choice(sorted(convs))
                sources = convs[src]
                leaf = sources[rng.randrange(len(sources))].id if sources else None
                o, k = next(next_id), next(next_id)
                chain += [msg(o, content=open_text(src, leaf)), msg(k, content=close_text(src))]
                pointers[o] = Pointer(o, k, src, leaf)
            elif kind < 0.6:
                cid = f"t{next(next_id)}"
                chain += [msg(next(next_id)), call(next(next_id), cid), result(next(next_id), cid)]
            else:
                chain += [msg(next(next_id)), msg(next(next_id), "assistant")]
        convs[name], ptrs[name] = chain, pointers
    return convs, ptrs


def reference(name: str, convs: Any, ptrs: Any, seen: set[int], depth: int = 0) -> list[int]:
    """Plain recursion: own messages, each attachment's source prefix not seen yet."""
    out: list[int] = []
    closes = {p.close_id for p in ptrs[name].values()}
    for m in convs[name]:
        if m.id in ptrs[name]:
            p = ptrs[name][m.id]
            out.append(m.id)
            chain = convs[p.source]
            upto = [x for x in chain[: [x.id for x in chain].index(p.leaf) + 1]] if p.leaf else []
            fresh = [x for x in upto if x.id not in seen]
            # a prefix may end between a call and its result: that call is not brought
            if fresh and fresh[-1].tool_calls:
                fresh = fresh[:-1]
            seen.update(x.id for x in fresh)
            sub = {x.id for x in fresh}
            out += reference_sub(p.source, fresh, sub, convs, ptrs, seen, depth + 1)
        elif m.id in closes:
            out.append(m.id)
        else:
            out.append(m.id)
    return out


def reference_sub(
    name: str, fresh: list[Msg], sub: set[int], convs: Any, ptrs: Any, seen: set[int], depth: int
) -> list[int]:
    out: list[int] = []
    for m in fresh:
        out.append(m.id)
        if m.id in ptrs[name]:
            p = ptrs[name][m.id]
            chain = convs[p.source]
            upto = chain[: [x.id for x in chain].index(p.leaf) + 1] if p.leaf else []
            more = [x for x in upto if x.id not in seen]
            if more and more[-1].tool_calls:
                more = more[:-1]
            seen.update(x.id for x in more)
            out += reference_sub(p.source, more, set(), convs, ptrs, seen, depth + 1)
    return out


@pytest.mark.parametrize("seed", range(60))
def test_random_trees_against_reference(seed: int) -> None:
    rng = random.Random(seed)
    convs, ptrs = random_world(rng)
    name = sorted(convs)[-1]

    def load(p: Pointer) -> Source | None:
        chain = convs[p.source]
        ids = [x.id for x in chain]
        return Source(chain[: ids.index(p.leaf) + 1], ptrs[p.source]) if p.leaf in ids else None

    out = expand(convs[name], ptrs[name], load)
    got = [m.id for m in out.branch]
    want = reference(name, convs, ptrs, {m.id for m in convs[name]})
    assert got == want
    assert len(got) == len(set(got))  # none expanded twice
    own = {m.id for m in convs[name]}
    assert own <= set(got)  # no item of its own lost
    assert paired(out.branch) == out.branch  # tool pairs valid
    for m in out.branch:
        assert (m.id in own) != (m.id in out.provenance)


def test_summary_split_never_inside_an_attachment() -> None:
    """The planner's cut (``plan_split``) falls before the open marker or after the close one."""
    from recap.core.summaries.planning import plan_split

    own = [msg(1), msg(2, "assistant"), msg(3)]
    block = [msg(4, content=open_text("sub", 104)), *SUB, msg(5, content=close_text("sub"))]
    tail = [msg(6, "assistant"), msg(7), msg(8, "assistant")]
    messages = [*own, *block, *tail]
    split_inside = 0
    for budget in range(0, 80, 5):
        free = plan_split(messages, recent_budget=budget, recent_cap=budget)
        held = plan_split(messages, recent_budget=budget, recent_cap=budget, attached=[(4, 5)])
        if free is not None and (4 in [m.id for m in free.older]) != (
            5 in [m.id for m in free.older]
        ):
            split_inside += 1  # without the spans, this cut would split the block
        if held is not None:
            older = [m.id for m in held.older]
            assert (4 in older) == (5 in older), (budget, older)
    assert split_inside > 0
