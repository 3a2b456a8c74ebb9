"""The deploy artifact is complete: every third-party module that deployed code imports (the function app and the
Agent image) comes from a distribution listed in requirements.txt (or one of its dependencies)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOYED = ["function_app.py", "triggers", "activities", "orchestrators", "orderflow", "agent"]
LOCAL = {"function_app", "triggers", "activities", "orchestrators", "orderflow", "agent"}
# The operator CLI is in the package but in neither artifact (.funcignore, the Agent's .dockerignore): it runs on the
# operator's machine with requirements-dev.txt (rich).
NOT_DEPLOYED = ("orderflow/cli/", "orderflow/__main__.py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _closure(distributions: set[str]) -> set[str]:
    """The listed distributions and everything they depend on (unconditional requirements)."""
    seen: set[str] = set()
    todo = list(distributions)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:  # a dependency only for other Pythons (marker), not installed here
            continue
        for req in reqs:
            if "extra ==" not in req:
                todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return seen


def test_every_third_party_import_of_deployed_code_is_in_requirements_txt() -> None:
    listed = {re.split(r"[<>=!~\[ ]", line, maxsplit=1)[0].strip() for line in
              (ROOT / "requirements.txt").read_text().splitlines() if line.strip() and not line.startswith("#")}
    available = _closure(listed)
    providers = packages_distributions()
    files = [p for entry in DEPLOYED for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir()
                                                else [ROOT / entry])
             if not str(p.relative_to(ROOT)).startswith(NOT_DEPLOYED)]
    missing: dict[str, str] = {}
    for path in files:
        for module in _imports(path) - LOCAL - set(sys.stdlib_module_names) - {"__future__"}:
            dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
            if not dists & available:
                missing[module] = str(path.relative_to(ROOT))
    assert not missing, f"imported by deployed code but not installed from requirements.txt: {missing}"


def test_what_is_not_deployed_is_left_out_of_both_artifacts_and_never_imported_by_what_is() -> None:
    for ignore in (ROOT / ".funcignore", ROOT / "infra" / "agent" / "Dockerfile.dockerignore"):
        lines = set(ignore.read_text().splitlines())
        assert set(NOT_DEPLOYED) <= lines, f"{ignore.name} must leave out {NOT_DEPLOYED}"
    deployed = [p for entry in DEPLOYED for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir()
                                                  else [ROOT / entry])
                if not str(p.relative_to(ROOT)).startswith(NOT_DEPLOYED)]
    importers = [str(p.relative_to(ROOT)) for p in deployed if "orderflow.cli" in p.read_text()]
    assert not importers, f"deployed code imports the CLI, which is not deployed: {importers}"
