"""The three rings hold: the core is pure, sources touch the host, the shell wires them (docs/design.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "exporter"
CORE = sorted((PACKAGE / "core").glob("*.py"))
SOURCES = sorted((PACKAGE / "sources").glob("*.py"))

# What a core module may not import: the host's libraries, the clock, the other two rings.
IMPURE = {"time", "os", "socket", "sqlite3", "systemd", "psutil", "pynvml", "subprocess", "threading",
          "multiprocessing", "logging", "signal", "shutil", "tempfile", "selectors", "ssl", "http", "urllib",
          "asyncio", "ctypes", "exporter.sources", "exporter.shell", "prometheus_client", "yaml", "io"}
# Calls that read a clock or touch a file, whatever module they come from.
IMPURE_CALLS = {"open", "now", "today", "utcnow", "monotonic", "time", "read_text", "read_bytes", "write_text",
                "write_bytes", "mkdir", "unlink", "exists", "is_file", "is_dir", "stat", "iterdir", "glob"}
# The grammars are package data, read like the code beside them: the one file a core module reads.
ALLOWED_CALLS = {("grammar.py", "read_text")}


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _calls(tree: ast.AST) -> set[str]:
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return called


def _forbidden(name: str, banned: set[str]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in banned)


@pytest.mark.parametrize("module", CORE, ids=lambda p: p.name)
def test_a_core_module_imports_nothing_impure(module: Path) -> None:
    bad = sorted(n for n in _imports(ast.parse(module.read_text())) if _forbidden(n, IMPURE))
    assert not bad, f"exporter/core/{module.name} imports {bad}: the core takes values and returns values"


@pytest.mark.parametrize("module", CORE, ids=lambda p: p.name)
def test_a_core_module_reads_no_clock_and_no_file(module: Path) -> None:
    calls = _calls(ast.parse(module.read_text())) & IMPURE_CALLS
    bad = sorted(c for c in calls if (module.name, c) not in ALLOWED_CALLS)
    assert not bad, f"exporter/core/{module.name} calls {bad}"


@pytest.mark.parametrize("module", SOURCES, ids=lambda p: p.name)
def test_a_source_never_reaches_into_the_shell(module: Path) -> None:
    bad = sorted(n for n in _imports(ast.parse(module.read_text())) if _forbidden(n, {"exporter.shell"}))
    assert not bad, f"exporter/sources/{module.name} imports {bad}"


def test_the_check_catches_an_impure_core_module() -> None:
    tree = ast.parse("import time\nfrom exporter.sources.journal import fields_of\nx = time.monotonic()\n")
    assert {n for n in _imports(tree) if _forbidden(n, IMPURE)} == {
        "time", "exporter.sources.journal", "exporter.sources.journal.fields_of"}
    assert _calls(tree) & IMPURE_CALLS == {"monotonic"}


def test_every_module_is_in_a_ring() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules outside core/, sources/ and shell/: {loose}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (module → the modules it imports): each a path that comes back to its start."""
    circles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph[module]):
            if imported in path:
                circles.append([*path[path.index(imported):], imported])
            elif imported not in done:
                visit(imported, [*path, imported])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return circles


def test_no_two_modules_import_each_other_even_inside_a_function() -> None:
    """A circle (cli imports demo.run to run it, demo.run imports cli to serve) ties two responsibilities
    into one: whichever way round, one of them belongs elsewhere."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {n for n in _imports(ast.parse(path.read_text())) if n in modules and n != name}
             for name, path in modules.items()}
    assert not _cycles(graph), _cycles(graph)


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
