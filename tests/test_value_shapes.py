"""Values of more than four fields are built by keyword: every dataclass in ``core`` and
``workers`` with five fields or more is ``kw_only``, so no call site can put two fields of the
same type in each other's place. The named tuples of that size are listed with why they stay
positional (a new one fails, and one taken off must leave the list)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_POSITIONAL = 4
# Named tuples built once per stored row or per message of a request, where a tuple is the
# cheapest value Python has; each is made in one or two places, from a row's columns in order.
POSITIONAL_TUPLES = {
    "core/values/records.py:Msg": "a row of the messages table, per message read",
    "core/values/draft.py:Unit": "a piece of history, per message after the cutoff",
    "core/values/memory.py:MemoryRec": "a row of a user's memory, per entry per request",
    "core/values/attach.py:Pointer": "a row of the attachments, per attachment per request",
    "core/request/assembly/tail.py:FitTail": "what fit_tail returns, unpacked by its one caller",
}


def _fields(node: ast.ClassDef) -> list[str]:
    return [
        statement.target.id
        for statement in node.body
        if isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and "ClassVar" not in ast.unparse(statement.annotation)
    ]


def _values() -> tuple[set[str], set[str]]:
    """The dataclasses of more than four fields without ``kw_only``, and the named tuples of
    more than four fields, as ``path:Class``."""
    loose: set[str] = set()
    tuples: set[str] = set()
    for top in ("core", "workers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef) or len(_fields(node)) <= MAX_POSITIONAL:
                    continue
                name = f"{path.relative_to(ROOT).as_posix()}:{node.name}"
                decorators = [ast.unparse(d) for d in node.decorator_list]
                if any("dataclass" in d for d in decorators):
                    if not any("kw_only=True" in d for d in decorators):
                        loose.add(name)
                elif any(ast.unparse(base).endswith("NamedTuple") for base in node.bases):
                    tuples.add(name)
    return loose, tuples


def test_values_of_more_than_four_fields_are_built_by_keyword() -> None:
    loose, tuples = _values()
    assert loose == set(), "dataclasses of more than four fields without kw_only=True"
    assert tuples - set(POSITIONAL_TUPLES) == set(), "new positional named tuples"
    assert set(POSITIONAL_TUPLES) - tuples == set(), "gone: take them off POSITIONAL_TUPLES"
