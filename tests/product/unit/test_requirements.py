"""The deploy artifact is complete and exact: every third-party module that deployed code imports (the function app
and the Agent image) comes from a distribution listed in requirements.in (or one of its dependencies), and
requirements.txt, what Flex Consumption's remote build and the images install, pins that whole runtime closure to the
versions installed here, which are constraints.txt's."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
DEPLOYED = ["function_app.py", "triggers", "activities", "orchestrators", "orderflow", "agent"]
LOCAL = {"function_app", "triggers", "activities", "orchestrators", "orderflow", "agent", "lab"}
# The operator CLI is in the package but in neither artifact (.funcignore, the Agent's .dockerignore): it runs on the
# operator's machine with requirements-dev.txt (rich). Nor is the lab (drills, demo, fault switches), nor the local
# AMQP endpoint (python-qpid-proton, a dev requirement), nor the stand-ins' parser of infra/ (tree-sitter, dev).
NOT_DEPLOYED = (
    "orderflow/cli/",
    "orderflow/__main__.py",
    "orderflow/embedded/amqp/",
    "orderflow/embedded/rights/_bicep.py",
    "orderflow/embedded/rights/_grants.py",
    "lab/",
)
# The simulator image (infra/agent/Dockerfile.simulator) adds the lab's simulator to the Agent's code.
SIMULATOR_IMAGE = ["lab/__init__.py", "lab/simulator.py", "lab/simulator_ledger.py"]


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
    listed = {
        re.split(r"[<>=!~\[ ]", line, maxsplit=1)[0].strip()
        for line in (ROOT / "requirements.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    available = _closure(listed)
    providers = packages_distributions()
    files = [
        p
        for entry in DEPLOYED
        for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir() else [ROOT / entry])
        if not str(p.relative_to(ROOT)).startswith(NOT_DEPLOYED)
    ] + [ROOT / f for f in SIMULATOR_IMAGE]
    missing: dict[str, str] = {}
    for path in files:
        for module in _imports(path) - LOCAL - set(sys.stdlib_module_names) - {"__future__"}:
            dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
            if not dists & available:
                missing[module] = str(path.relative_to(ROOT))
    assert not missing, f"imported by deployed code but not installed from requirements.in: {missing}"


def test_what_is_not_deployed_is_left_out_of_both_artifacts_and_never_imported_by_what_is() -> None:
    for ignore in (ROOT / ".funcignore", ROOT / "infra" / "agent" / "Dockerfile.dockerignore"):
        lines = set(ignore.read_text().splitlines())
        assert set(NOT_DEPLOYED) <= lines, f"{ignore.name} must leave out {NOT_DEPLOYED}"
    deployed = [
        p
        for entry in DEPLOYED
        for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir() else [ROOT / entry])
        if not str(p.relative_to(ROOT)).startswith(NOT_DEPLOYED)
    ]
    importers = [str(p.relative_to(ROOT)) for p in deployed if "orderflow.cli" in p.read_text()]
    assert not importers, f"deployed code imports the CLI, which is not deployed: {importers}"
    lab_importers = [str(p.relative_to(ROOT)) for p in deployed if _imports(p) & {"lab", "devhost"}]
    assert not lab_importers, f"deployed code imports the lab or devhost, which are not deployed: {lab_importers}"


def _requirements(name: str) -> list[Requirement]:
    lines = (ROOT / name).read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def _runtime_closure() -> set[str]:
    """requirements.in's distributions and their dependencies as installed here (markers for this Python)."""
    seen: set[str] = set()
    todo = [req.name for req in _requirements("requirements.in")]
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in seen:
            seen.add(name)
            todo += [
                r.name
                for r in map(Requirement, requires(name) or [])
                if r.marker is None or r.marker.evaluate({"extra": ""})
            ]
    return seen


def _pins(name: str) -> dict[str, str]:
    """name -> version of each `==` pin of a requirements file that applies to this Python."""
    found = {}
    for req in _requirements(name):
        if req.marker is None or req.marker.evaluate():
            specs = list(req.specifier)
            assert len(specs) == 1 and specs[0].operator == "==", f"{name}: {req} is not an exact pin"
            found[canonicalize_name(req.name)] = specs[0].version
    return found


def test_deployed_python_is_the_one_the_pins_are_for() -> None:
    # The closure and its markers are computed on this interpreter: it must be the one Azure runs.
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    function = (ROOT / "infra" / "app" / "function.bicep").read_text()
    assert re.search(rf"name: 'python'\s+version: '{re.escape(running)}'", function), "Flex runtime version"
    for dockerfile in ("Dockerfile", "Dockerfile.simulator"):
        assert f"FROM python:{running}-" in (ROOT / "infra" / "agent" / dockerfile).read_text(), dockerfile


def test_requirements_txt_pins_exactly_the_installed_runtime_closure() -> None:
    pins = _pins("requirements.txt")
    closure = _runtime_closure()
    assert sorted(closure - set(pins)) == [], "runtime packages Azure would install unpinned"
    assert sorted(set(pins) - closure) == [], "pinned but not in the runtime closure"
    drift = {name: (pin, version(name)) for name, pin in pins.items() if version(name) != pin}
    assert drift == {}, "requirements.txt pin vs installed in .venv"


def test_every_pin_of_requirements_txt_is_the_constraints_pin_for_every_python() -> None:
    def by_marker(name: str) -> dict[tuple[str, str], str]:
        return {(canonicalize_name(r.name), str(r.marker or "")): str(r.specifier) for r in _requirements(name)}

    constraints, pinned = by_marker("constraints.txt"), by_marker("requirements.txt")
    unmarked = {name: spec for (name, marker), spec in constraints.items() if not marker}
    for (name, marker), spec in pinned.items():
        assert spec == constraints.get((name, marker), unmarked.get(name)), f"{name} {marker}: {spec}"
    assert all(spec.startswith("==") for spec in pinned.values())


def test_requirements_in_ranges_admit_the_pins() -> None:
    pins = _pins("requirements.txt")
    for req in _requirements("requirements.in"):
        assert req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True), req
