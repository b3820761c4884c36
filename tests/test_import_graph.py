"""The import graph, read from the source with ``ast``: the engine sits below its doors.

- the lower floors of ``core`` (counting, request, decision, summaries, values) import nothing
  from ``core.storage``;
- ``core.values`` (the bottom floor) imports no other ``core`` module but ``core.errors``;
- ``core`` imports nothing from ``workers``, and ``workers/serve`` no SQL, except the places
  listed in ``KNOWN`` (each with its reason); a new one fails, and a listed one that is gone
  must be taken off the list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ("core/counting", "core/request", "core/decision", "core/summaries", "core/values")
SQL_MODULES = ("sqlalchemy", "sqlmodel", "psycopg", "sqlite3")
# Edges still to cut, with why they are there today.
KNOWN: set[tuple[str, str]] = set()


def imports_of(path: Path) -> Iterator[str]:
    """Every module a file imports, at any depth (imports inside functions count too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def edges() -> set[tuple[str, str]]:
    """(file, imported top module or the first two parts) for the rules below."""
    found: set[tuple[str, str]] = set()
    for path in [*files("core"), *files("workers/serve")]:
        name = str(path.relative_to(ROOT))
        if "migrations" in name:
            continue
        for module in imports_of(path):
            parts = module.split(".")
            if name.startswith("core/") and parts[0] == "workers":
                found.add((name, ".".join(parts[:2])))
            if name.startswith("workers/serve/") and parts[0] in SQL_MODULES:
                found.add((name, parts[0]))
    return found


def test_the_lower_floors_import_no_storage() -> None:
    """counting, request, decision, summaries and values never import core.storage."""
    bad = [
        (str(path.relative_to(ROOT)), module)
        for folder in FLOORS
        for path in files(folder)
        for module in imports_of(path)
        if module == "recap.core.storage" or module.startswith("recap.core.storage.")
    ]
    assert bad == []


def test_the_bottom_floor_imports_only_errors() -> None:
    """recap.core.values imports no other core module but core.errors."""
    bad = [
        (str(path.relative_to(ROOT)), module)
        for path in files("core/values")
        for module in imports_of(path)
        if module.startswith("core.") and not module.startswith(("recap.core.values", "recap.core.errors"))
    ]
    assert bad == []


def test_core_imports_no_workers_and_serve_no_sql_beyond_the_known_edges() -> None:
    """A new edge fails; an edge that is gone is taken off the list."""
    found = edges()
    assert found - KNOWN == set(), "new edges"
    assert KNOWN - found == set(), "edges gone: take them off KNOWN"
