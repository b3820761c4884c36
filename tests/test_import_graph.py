"""The import graph, read from the source with ``ast``: the engine sits below its doors.

- the lower floors of ``core`` (counting, request, decision, summaries, values) import nothing
  from ``core.storage``;
- ``core.values`` (the bottom floor) imports no other ``core`` module but ``core.errors``;
- ``core`` imports nothing from ``workers``, and ``workers/serve`` no SQL, except the places
  listed in ``KNOWN`` (each with its reason); a new one fails, and a listed one that is gone
  must be taken off the list;
- ``recap serve``, the console, the CLI and the framework adapters never import
  ``core.storage``: they reach the database through ``core.service``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ("core/counting", "core/request", "core/decision", "core/summaries", "core/values")
SQL_MODULES = ("sqlalchemy", "sqlmodel", "psycopg", "sqlite3")
# Edges still to cut, with why they are there today.
KNOWN: set[tuple[str, str]] = set()
# the installed names of the top-level folders (recap/core and recap/workers link to them)
INSTALLED = ("recap.core.", "recap.workers.")
INSTALLED_PACKAGES = ("recap.core", "recap.workers")


def absolute_imports(path: Path) -> Iterator[str]:
    """Every module a file imports as written, at any depth (imports inside functions count)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def imports_of(path: Path) -> Iterator[str]:
    """Every module a file imports, named by its folder: ``recap.core.x`` is ``core.x`` here."""
    for module in absolute_imports(path):
        installed = module in INSTALLED_PACKAGES or module.startswith(INSTALLED)
        yield module.removeprefix("recap.") if installed else module


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


def storage_imports(folders: tuple[str, ...]) -> list[tuple[str, str]]:
    """(file, module) for every import of ``core.storage`` in ``folders``."""
    return [
        (str(path.relative_to(ROOT)), module)
        for folder in folders
        for path in files(folder)
        for module in imports_of(path)
        if module == "core.storage" or module.startswith("core.storage.")
    ]


def test_the_lower_floors_import_no_storage() -> None:
    """counting, request, decision, summaries and values never import core.storage."""
    assert storage_imports(FLOORS) == []


DOORS = ("workers/serve", "workers/ui", "workers/cli", "recap/integrations")


def test_serve_console_cli_and_adapters_never_import_core_storage() -> None:
    """serve, console, CLI and adapters never import core.storage: each operation they need on
    the database is one of ``core.service``, which opens its own session."""
    assert storage_imports(DOORS) == []


def test_the_bottom_floor_imports_only_errors() -> None:
    """core.values imports no other core module but core.errors."""
    bad = [
        (str(path.relative_to(ROOT)), module)
        for path in files("core/values")
        for module in imports_of(path)
        if module.startswith("core.") and not module.startswith(("core.values", "core.errors"))
    ]
    assert bad == []


def test_core_imports_no_workers_and_serve_no_sql_beyond_the_known_edges() -> None:
    """A new edge fails; an edge that is gone is taken off the list."""
    found = edges()
    assert found - KNOWN == set(), "new edges"
    assert KNOWN - found == set(), "edges gone: take them off KNOWN"


def test_everything_imports_recap_by_its_installed_name() -> None:
    """Nothing imports the top-level ``core`` or ``workers`` packages: the wheel installs them as
    ``recap.core`` and ``recap.workers`` only, so a host project's own ``core`` app is never
    shadowed (and a module imported under two names would be two modules)."""
    bad = [
        (str(path.relative_to(ROOT)), module)
        for folder in ("core", "workers", "recap", "tests", "bench")
        for path in files(folder)
        if not path.relative_to(ROOT).as_posix().startswith(("recap/core/", "recap/workers/"))
        for module in absolute_imports(path)
        if module.split(".")[0] in ("core", "workers")
    ]
    assert bad == []


# --- the layout page's table of floors -----------------------------------------------------------

LAYOUT = ROOT / "docs" / "layout.md"
OWN_FOLDERS = ("core", "workers", "recap")


def floors() -> list[tuple[str, list[str]]]:
    """The rows of docs/layout.md's "What imports what" table: (folder, what it may import)."""
    text = LAYOUT.read_text(encoding="utf-8").split("## What imports what", 1)[1]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows.append((cells[0].strip("`"), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def module_path(module: str) -> str | None:
    """The file or folder of an imported Recap module, by its folder name (``recap.core.x`` is
    ``core/x.py``), or None for a module that is not Recap's."""
    parts = module.split(".")
    if parts[0] == "recap" and len(parts) > 1 and parts[1] in ("core", "workers"):
        parts = parts[1:]
    elif parts[0] not in ("recap",):
        return None
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py").relative_to(ROOT).as_posix()
        if (base / "__init__.py").is_file():
            return (base / "__init__.py").relative_to(ROOT).as_posix()
    return None


def allowed(target: str, rules: list[str]) -> bool:
    for rule in rules:
        if rule.endswith("/**") and target.startswith(rule[:-2]):
            return True
        if (
            rule.endswith("/*")
            and target.startswith(rule[:-1])
            and "/" not in target[len(rule) - 1 :]
        ):
            return True  # a module at the folder's top, not in one of its folders
        if rule.endswith("/") and target.startswith(rule) and target.count("/") >= rule.count("/"):
            return True
        if target == rule or (rule.endswith("/") and target == rule + "__init__.py"):
            return True
    return False


def folder_of(path: str, rows: list[tuple[str, list[str]]]) -> tuple[str, list[str]]:
    """The most specific row whose folder holds ``path``."""
    holding = [row for row in rows if path.startswith(row[0])]
    return max(holding, key=lambda row: len(row[0]))


def test_every_import_keeps_to_the_layout_pages_floors() -> None:
    rows = floors()
    assert len(rows) >= 10, "the table of floors was not found in docs/layout.md"
    bad = []
    for top in OWN_FOLDERS:
        for path in files(top):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith(("recap/core/", "recap/workers/")) or "/versions/" in name:
                continue
            folder, rules = folder_of(name, rows)
            for module in absolute_imports(path):
                target = module_path(module)
                if target is None or target.startswith(folder) or target == name:
                    continue
                if not allowed(target, rules):
                    bad.append((name, target))
    assert sorted(set(bad)) == []


def test_the_layout_page_names_every_folder_and_only_real_ones() -> None:
    text = LAYOUT.read_text(encoding="utf-8")
    named = set(re.findall(r"^\| `([\w/]+/)`", text, re.M))
    real = {
        path.parent.relative_to(ROOT).as_posix() + "/"
        for top in OWN_FOLDERS
        for path in (ROOT / top).rglob("__init__.py")
        if not path.relative_to(ROOT).as_posix().startswith(("recap/core/", "recap/workers/"))
        and len(path.relative_to(ROOT).parts) <= 3  # a folder's own folders are in its row
    }
    assert real - named == set(), "folders the layout page does not name"
    missing = {n for n in named if not (ROOT / n).is_dir()}
    assert missing == set(), "folders the layout page names that do not exist"


# --- circles and sizes ---------------------------------------------------------------------------

# Import circles between modules still to break (deferred imports count; type-only ones do not).
KNOWN_CIRCLES: set[frozenset[str]] = set()
# Files still over the size cap, each to be split; the list may only shrink.
MAX_LINES = 600
KNOWN_LONG: set[str] = set()


def runtime_imports(path: Path) -> Iterator[str]:
    """The modules a file imports when it runs (at any depth), leaving out ``if TYPE_CHECKING:``
    blocks, which never run."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def module_graph() -> dict[str, set[str]]:
    """Each of Recap's modules (by file) and the modules it imports at run time."""
    graph: dict[str, set[str]] = {}
    for top in OWN_FOLDERS:
        for path in files(top):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith(("recap/core/", "recap/workers/")) or "/versions/" in name:
                continue
            targets = {module_path(m) for m in runtime_imports(path)}
            own_packages = {
                p.relative_to(ROOT).as_posix() + "/__init__.py"
                for p in path.parents
                if p.is_relative_to(ROOT) and p != ROOT
            }  # importing a module runs its packages' __init__ first: no edge of its own
            graph[name] = {t for t in targets if t and t != name and t not in own_packages}
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.add(frozenset(group))
    return found


def test_circles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert circles(graph) == {frozenset({"a", "b", "c"})}


def test_no_import_circles_beyond_the_known_ones() -> None:
    found = circles(module_graph())
    assert found - KNOWN_CIRCLES == set(), "new circles"
    assert KNOWN_CIRCLES - found == set(), "circles gone: take them off KNOWN_CIRCLES"


def test_no_file_over_the_cap_beyond_the_known_ones() -> None:
    long = {
        path.relative_to(ROOT).as_posix()
        for top in ("core", "workers")
        for path in files(top)
        if "migrations" not in path.parts
        and len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES
    }
    assert long - KNOWN_LONG == set(), f"files over {MAX_LINES} lines"
    assert KNOWN_LONG - long == set(), "files now within the cap: take them off KNOWN_LONG"
