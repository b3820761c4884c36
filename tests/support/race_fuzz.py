"""The erasure race fuzz: seeded random interleavings of add, assemble, compress (on a real
worker), delete, re-create, pin, recall and retention on a few conversation ids shared by two
owners, checked for resurrected rows, cross-owner reads, lost messages and errors.

Every message names its owner, its conversation id, the id's generation (bumped by each delete
or expiry) and its number, ``[A r1 g3 m7]``, so any text read or written anywhere says where it
came from. Driver threads run the operations; those on one id take that id's lock (the ledger of
what each generation holds stays exact), while the worker's runs, enqueued and never awaited,
overlap every delete and re-creation of their id. The suite runs a short seeded subset
(``tests/test_race_fuzz.py``), ``bench/race.py`` the full run.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, select

from recap.core.client import Recap
from recap.core.errors import NotFoundError, PinLimitError
from recap.core.request.refs import message_ref
from recap.core.settings import Settings
from recap.core.storage import erase, store
from recap.core.storage.db import session_scope
from recap.core.storage.models import CLEARINGS, MESSAGES, PINS, SUMMARIES, utcnow

OWNERS = ("A", "B")
WINDOW = 3_000  # small: a dozen turns go over the trigger
FILLER_WORDS = 40  # about 150 tokens a message, so runs have something to summarize
TAG = re.compile(r"\[([AB]) (r\d+) g(\d+) m\d+\]")
OPERATIONS = (
    ("add", 6),
    ("assemble", 3),
    ("compress", 4),
    ("delete", 1),
    ("recreate", 2),
    ("pin", 1),
    ("recall", 2),
    ("expire", 1),
)
RECREATED_TURNS = 4  # messages a re-created conversation gets at once, while runs are in flight


@dataclass
class Slot:
    """One conversation id: who owns its current generation and what that generation holds."""

    cid: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0
    owner: str | None = None  # None: not stored
    messages: dict[int, str] = field(default_factory=dict)  # id -> text, this generation
    erased: list[int] = field(default_factory=list)  # ids of earlier generations


@dataclass
class Figures:
    """What one fuzz run counted."""

    operations: int = 0
    runs: int = 0
    resurrected_rows: int = 0
    cross_tenant_reads: int = 0
    lost_messages: int = 0
    errors: int = 0
    actions: dict[str, int] = field(default_factory=dict)  # what the worker's runs did
    failures: list[str] = field(default_factory=list)

    def fail(self, kind: str, text: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.failures) < 50:
            self.failures.append(f"{kind}: {text}")


Enqueue = Callable[[str, bool], Any]  # (conversation id, force) -> an async result


class Fuzz:
    """One seeded run over ``ids`` conversation ids."""

    def __init__(self, engine: Engine, settings: Settings, enqueue: Enqueue, seed: int, ids: int):
        self.engine, self.settings, self.enqueue = engine, settings, enqueue
        self.recap = Recap(settings, engine)
        self.random = random.Random(seed)
        self.slots = [Slot(f"r{i}") for i in range(ids)]
        self.figures = Figures()
        self.pending: list[Any] = []
        self.lock = threading.Lock()

    # --- operations ------------------------------------------------------------------------

    def text(self, slot: Slot, owner: str, n: int) -> str:
        words = " ".join(f"w{n}x{i}" for i in range(FILLER_WORDS))
        return f"[{owner} {slot.cid} g{slot.generation} m{n}] {words}"

    def ensure(self, slot: Slot, owner: str) -> bool:
        """The slot's conversation for ``owner``: created when missing; False when the other
        owner holds it (as ``recap serve`` hides it)."""
        if slot.owner is None:
            with session_scope(self.engine) as session:
                store.ensure_conversation(
                    session, slot.cid, self.settings.default_model, WINDOW, owner=owner
                )
            slot.owner = owner
        return slot.owner == owner

    def add(self, slot: Slot, owner: str, rng: random.Random) -> None:
        if not self.ensure(slot, owner):
            return
        for _ in range(rng.randint(1, 4)):
            self.add_one(slot, owner)

    def add_one(self, slot: Slot, owner: str) -> None:
        n = len(slot.messages)
        role = "user" if n % 2 == 0 else "assistant"
        text = self.text(slot, owner, n)
        slot.messages[self.recap.add(slot.cid, {"role": role, "content": text})] = text

    def assemble(self, slot: Slot, owner: str, rng: random.Random) -> None:
        if slot.owner != owner:
            return
        with session_scope(self.engine) as session:
            if not store.owned_by(session.connection(), slot.cid, owner):
                self.figures.fail("cross_tenant_reads", f"{slot.cid} not {owner}'s in the db")
                return
        request = self.recap.assemble(slot.cid, system="fuzz")
        self.check_texts(slot, owner, [str(m.get("content") or "") for m in request.messages])

    def compress(self, slot: Slot, owner: str, rng: random.Random) -> None:
        if slot.owner is not None:
            with self.lock:
                self.pending.append(self.enqueue(slot.cid, rng.random() < 0.5))

    def delete(self, slot: Slot, owner: str, rng: random.Random) -> None:
        if slot.owner is None:
            return
        self.recap.delete(slot.cid)
        self.forget(slot)

    def recreate(self, slot: Slot, owner: str, rng: random.Random) -> None:
        """Delete the id (when stored) and create it again at once, for either owner, with a
        few messages: the runs enqueued for the erased conversation are still in flight."""
        if slot.owner is not None:
            self.recap.delete(slot.cid)
            self.forget(slot)
        self.ensure(slot, owner)
        for _ in range(RECREATED_TURNS):
            self.add_one(slot, owner)

    def expire(self, slot: Slot, owner: str, rng: random.Random) -> None:
        if slot.owner is None:
            return
        idle_before = utcnow() + timedelta(seconds=1)
        done = erase.delete_conversation(
            self.engine, slot.cid, self.settings.output_dir, idle_before=idle_before
        )
        if done is not None:
            self.forget(slot)

    def pin(self, slot: Slot, owner: str, rng: random.Random) -> None:
        if slot.owner != owner or not slot.messages:
            return
        if slot.erased and rng.random() < 0.5:  # an erased id never pins into the new one
            try:
                self.recap.pin(slot.cid, rng.choice(slot.erased))
            except NotFoundError:
                return
            self.figures.fail("resurrected_rows", f"{slot.cid}: an erased message was pinned")
            return
        try:
            self.recap.pin(slot.cid, rng.choice(list(slot.messages)))
        except PinLimitError:
            return

    def recall(self, slot: Slot, owner: str, rng: random.Random) -> None:
        if slot.owner != owner:
            return
        if slot.erased:
            try:
                got = self.recap.recall(slot.cid, message_ref(rng.choice(slot.erased)))
            except NotFoundError:
                pass
            else:
                self.figures.fail("resurrected_rows", f"{slot.cid}: erased ref gave {got.text!r}")
        if slot.messages:
            mid = rng.choice(list(slot.messages))
            got = self.recap.recall(slot.cid, message_ref(mid))
            self.check_texts(slot, owner, [got.text])

    def forget(self, slot: Slot) -> None:
        slot.erased.extend(slot.messages)
        slot.messages.clear()
        slot.owner = None
        slot.generation += 1

    # --- checks ----------------------------------------------------------------------------

    def check_texts(self, slot: Slot, owner: str, texts: list[str]) -> None:
        """Every tag in what ``owner`` read of ``slot`` is its own, of this generation."""
        for text in texts:
            for tag_owner, cid, generation in TAG.findall(text):
                if tag_owner != owner:
                    self.figures.fail("cross_tenant_reads", f"{owner} read {tag_owner}'s text")
                elif cid != slot.cid or int(generation) != slot.generation:
                    self.figures.fail(
                        "resurrected_rows",
                        f"{slot.cid} g{slot.generation} read {cid} g{generation}",
                    )

    def step(self, rng: random.Random) -> None:
        names = [name for name, _ in OPERATIONS]
        weights = [weight for _, weight in OPERATIONS]
        name = rng.choices(names, weights)[0]
        slot = rng.choice(self.slots)
        owner = rng.choice(OWNERS)
        with slot.lock:
            try:
                getattr(self, name)(slot, owner, rng)
            except Exception as exc:  # counted: no operation of the fuzz may raise
                self.figures.fail("errors", f"{name} {slot.cid}: {type(exc).__name__}: {exc}")
        with self.lock:
            self.figures.operations += 1

    def run(self, operations: int, threads: int, wait: Callable[[Any], dict[str, Any]]) -> Figures:
        seeds = [self.random.randrange(2**32) for _ in range(threads)]

        def driver(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(operations // threads):
                self.step(rng)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(driver, seeds))
        for pending in self.pending:
            result = wait(pending)
            self.figures.runs += 1
            action = str(result.get("action"))
            self.figures.actions[action] = self.figures.actions.get(action, 0) + 1
            if result.get("action") == "failed":
                self.figures.fail("errors", f"run failed: {result.get('reason')}")
        self.final_checks()
        return self.figures

    def final_checks(self) -> None:
        for slot in self.slots:
            self.check_stored(slot)

    def check_stored(self, slot: Slot) -> None:
        """The stored conversation holds its generation's messages, every one, and nothing
        written from another generation or naming another's messages."""
        with session_scope(self.engine) as session:
            connection = session.connection()
            own = {
                int(r[0])
                for r in connection.execute(
                    select(MESSAGES.c.id).where(MESSAGES.c.conversation_id == slot.cid)
                )
            }
            named = [
                int(r[0])
                for table, column in (
                    (SUMMARIES, SUMMARIES.c.cutoff_message_id),
                    (CLEARINGS, CLEARINGS.c.message_id),
                    (PINS, PINS.c.message_id),
                )
                for r in connection.execute(
                    select(column).where(table.c.conversation_id == slot.cid)
                )
            ]
            summaries = [
                str(r[0])
                for r in connection.execute(
                    select(SUMMARIES.c.text).where(SUMMARIES.c.conversation_id == slot.cid)
                )
            ]
        for mid in named:
            if mid not in own:
                self.figures.fail("resurrected_rows", f"{slot.cid}: a row names message {mid}")
        if slot.owner is not None:
            self.check_texts(slot, slot.owner, summaries)
        missing = set(slot.messages) - own
        for mid in sorted(missing):
            self.figures.fail("lost_messages", f"{slot.cid}: message {mid} is gone")


def run(
    engine: Engine,
    settings: Settings,
    enqueue: Enqueue,
    wait: Callable[[Any], dict[str, Any]],
    *,
    seed: int,
    ids: int = 3,
    operations: int = 200,
    threads: int = 4,
) -> Figures:
    """One seeded fuzz run; its figures."""
    return Fuzz(engine, settings, enqueue, seed, ids).run(operations, threads, wait)


def figures_text(figures: Figures) -> str:
    """A short account of a run, for a failing assertion."""
    head = (
        f"{figures.operations} operations, {figures.runs} runs: "
        f"resurrected {figures.resurrected_rows}, cross-owner {figures.cross_tenant_reads}, "
        f"lost {figures.lost_messages}, errors {figures.errors}; runs {figures.actions}"
    )
    return "\n".join([head, *figures.failures])
