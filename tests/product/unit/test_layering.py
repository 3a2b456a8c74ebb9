"""The layering of README "The parts", checked from the code's imports: nothing deployed imports the lab, devhost or
the CLI; the stand-ins import no host; only devhost's command aliases (and tests, benchmarks) import the lab; no circle.

Every .py is parsed with `ast`. Every import counts, at module level or in a function, under `if TYPE_CHECKING` too:
`import a.b`, `from a import b`, relative imports (resolved against the importer's package), and
`importlib.import_module("a.b")` / `__import__("a.b")` with a literal name (a computed name is not seen). `import a.b.c`
runs `a`, `a.b` and `a.b.c`: an edge to each; the packages above the importer are no edge (they run before it), but a
name read from one of them is. `tests/` is on sys.path too (`from support import ...`).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())  # wherever tests/ puts it
SKIP_DIRS = {"node_modules", "__pycache__", "reports"}
# Directories on sys.path besides the root (the suite runs with PYTHONPATH=.:tests).
PATH_ENTRIES = ("", "tests")

DEPLOYED = ("function_app", "triggers", "orchestrators", "activities", "agent", "orderflow")
# The stand-ins, and the operator CLI with its `python -m orderflow` entry (.funcignore and the Agent's .dockerignore
# leave both CLI paths out).
NOT_DEPLOYED_CORE = ("orderflow.embedded", "orderflow.cli", "orderflow.__main__")
NEVER_FROM_DEPLOYED = ("lab", "devhost", "orderflow.cli", "benchmarks", "tests")
LAB_IMPORTERS = ("lab", "devhost.__main__", "tests", "benchmarks")


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: dict[str, int] = field(default_factory=dict)  # imported repository module -> first line


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _sources() -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):  # pruned: never into .venv, .git or node_modules
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        yield from (Path(folder) / f for f in sorted(files) if f.endswith(".py"))


def _modules() -> dict[str, Module]:
    found = {}
    for path in _sources():
        name, is_package = _module_name(path)
        found[name] = Module(name, path, is_package)
    for module in found.values():
        module.imports = _imports_of(module, found)
    return found


def _resolve(name: str, known: dict[str, Module]) -> str | None:
    """The repository module an absolute name denotes, trying each sys.path entry; None for a third-party one."""
    for entry in PATH_ENTRIES:
        candidate = f"{entry}.{name}" if entry else name
        if candidate in known:
            return candidate
    return None


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _literal_import(node: ast.Call) -> str | None:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in {"import_module", "__import__"} or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _imports_of(module: Module, known: dict[str, Module]) -> dict[str, int]:
    own_package = module.name if module.is_package else module.name.rpartition(".")[0]
    running = set(_ancestors(own_package)) if own_package else set()  # run before the importer: no edge
    edges: dict[str, int] = {}

    def add(absolute: str, line: int, *, whole_chain: bool = True) -> None:
        for prefix in _ancestors(absolute) if whole_chain else [absolute]:
            target = _resolve(prefix, known)
            if target is not None and target != module.name and target not in running:
                edges.setdefault(target, line)

    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = own_package.split(".")[: len(own_package.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            add(base, node.lineno)
            for alias in node.names:
                submodule = _resolve(f"{base}.{alias.name}", known)
                if submodule is not None:
                    add(f"{base}.{alias.name}", node.lineno, whole_chain=False)
                else:  # a name defined (or re-exported) by `base`'s __init__: reading it needs that __init__ run
                    target = _resolve(base, known)
                    if target is not None and target != module.name:
                        edges.setdefault(target, node.lineno)
        elif isinstance(node, ast.Call) and (literal := _literal_import(node)) is not None:
            add(literal, node.lineno)
    return edges


MODULES = _modules()


def _violations(importers: list[Module], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{m.path.relative_to(ROOT)}:{line} imports {target}"
        for m in importers
        for target, line in sorted(m.imports.items())
        if _under(target, forbidden)
    ]


def test_the_parser_sees_the_repository() -> None:
    assert {"function_app", "orderflow.ports", "agent.worker", "devhost.__main__", "lab"} <= set(MODULES)
    assert "orderflow.ports" in MODULES["orderflow.recovery_index"].imports
    assert any(_under(t, ("lab",)) for t in MODULES["devhost.__main__"].imports), "devhost's aliases import lab"


def test_nothing_deployed_imports_the_lab_devhost_the_cli_benchmarks_or_tests() -> None:
    deployed = [m for m in MODULES.values() if _under(m.name, DEPLOYED) and not _under(m.name, NOT_DEPLOYED_CORE)]
    assert len(deployed) > 40
    assert _violations(deployed, NEVER_FROM_DEPLOYED) == []


def test_the_stand_ins_import_no_host_no_lab_no_cli() -> None:
    embedded = [m for m in MODULES.values() if _under(m.name, ("orderflow.embedded",))]
    assert embedded
    assert _violations(embedded, ("devhost", "lab", "orderflow.cli", "benchmarks", "tests")) == []


def test_nothing_imports_the_lab_but_devhost_s_command_aliases_tests_and_benchmarks() -> None:
    others = [m for m in MODULES.values() if not _under(m.name, LAB_IMPORTERS)]
    assert _violations(others, ("lab",)) == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:  # iterative, so a deep import chain cannot hit the recursion limit
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_import_circle_not_even_through_a_local_import() -> None:
    """No circle, function-local imports included, so none hides behind one.

    A package `__init__` that re-exports its private `_*.py` modules has an edge to each of them. A sibling's
    `from . import _core` (or `from pkg import _core`) is an edge to `pkg._core` only: `pkg` is already running. A
    sibling's `from . import Name` (or `from pkg import Name`), Name being defined or re-exported by `pkg/__init__.py`
    rather than a submodule, is an edge to `pkg` itself: while `__init__` imports that sibling, it is a circle that
    works only by the order of the re-exports, so it fails here.
    """
    graph = {name: set(m.imports) for name, m in MODULES.items()}
    circles = _circles(graph)
    described = [
        " <-> ".join(c)
        + ": "
        + "; ".join(f"{a} -> {b} (line {MODULES[a].imports[b]})" for a in c for b in sorted(graph[a]) if b in c)
        for c in circles
    ]
    assert described == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
