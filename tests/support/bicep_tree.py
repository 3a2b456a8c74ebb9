"""The infra tests' view of infra/**/*.bicep: the one parser and evaluator (orderflow/embedded/rights/_bicep.py,
which the stand-ins' rights read too), re-exported here, plus what only the tests read: parameter types, type
declarations, decorators, property paths, and azd's expansion of main.parameters.json and azure.yaml's services.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tree_sitter import Node

from orderflow.embedded.rights._bicep import (
    DEPLOYED,
    INFRA,
    REPO,
    BicepFile,
    Module,
    Opaque,
    Resource,
    Scope,
    all_files,
    app,
    bicep_literal,
    code_children,
    evaluate,
    literal,
    load,
    loop_parts,
    main,
    module_scope,
    object_get,
    object_items,
    parse,
    string_parts,
    string_value,
    syntax_errors,
    text,
    unwrap,
    with_params,
    with_values,
)

__all__ = [
    "DEPLOYED",
    "INFRA",
    "REPO",
    "BicepFile",
    "Module",
    "Opaque",
    "Resource",
    "Scope",
    "all_files",
    "app",
    "azd_parameters",
    "azd_substitute",
    "azure_yaml_services",
    "bicep_literal",
    "code_children",
    "decorators",
    "depends_on",
    "evaluate",
    "imported_types",
    "literal",
    "load",
    "loop_parts",
    "main",
    "module_scope",
    "object_get",
    "object_items",
    "param_type",
    "parse",
    "property_paths",
    "resolve_type",
    "string_parts",
    "string_value",
    "syntax_errors",
    "text",
    "type_declarations",
    "unwrap",
    "with_params",
    "with_values",
]

# ---------------------------------------------------------------- declarations: types, decorators, property paths

_RESOURCE_META = {"parent", "scope", "dependsOn"}


def param_type(bfile: BicepFile, name: str) -> str:
    """The declared type of parameter `name` as written ('string', 'submittingApp[]', ...)."""
    for decl in code_children(bfile.root):
        if decl.type == "parameter_declaration" and text(decl.named_children[0]) == name:
            return text(decl.named_children[1])
    raise KeyError(f"{bfile.name}: no parameter {name!r}")


def type_declarations(bfile: BicepFile) -> dict[str, Node]:
    """Each `type X = <value>` of the file: name -> the value node (an `object`, a union, ...)."""
    found: dict[str, Node] = {}
    for decl in code_children(bfile.root):
        if decl.type == "type_declaration":
            found[text(decl.named_children[0])] = decl.named_children[-1]
    return found


def imported_types(bfile: BicepFile) -> dict[str, BicepFile]:
    """Symbols brought in by `import { a, b } from 'file.bicep'`: symbol -> the file that declares it."""
    found: dict[str, BicepFile] = {}
    for decl in code_children(bfile.root):
        if decl.type == "import_functionality":
            source = next(c for c in decl.named_children if c.type == "string")
            target = load(str((bfile.path.parent / (string_value(source) or "")).resolve()), str(bfile.infra))
            for symbol in decl.named_children:
                if symbol.type == "identifier":
                    found[text(symbol)] = target
    return found


def resolve_type(bfile: BicepFile, name: str) -> Node | None:
    """The declaration value of user-defined type `name`, declared in the file or imported into it."""
    if name in type_declarations(bfile):
        return type_declarations(bfile)[name]
    source = imported_types(bfile).get(name)
    return type_declarations(source).get(name) if source is not None else None


def decorators(resource: Resource) -> list[str]:
    """The decorators written above a resource declaration, as text ('@batchSize(1)', ...)."""
    decl: Node | None = resource.body
    while decl is not None and decl.type != "resource_declaration":
        decl = decl.parent
    previous = decl.prev_named_sibling if decl is not None else None
    if previous is None or previous.type != "decorators":
        return []
    return [text(d) for d in previous.named_children if d.type == "decorator"]


def depends_on(resource: Resource) -> set[str]:
    """The symbols listed in a resource's explicit dependsOn."""
    value = resource.get("dependsOn")
    return {text(item) for item in code_children(value)} if value is not None and value.type == "array" else set()


def property_paths(resource: Resource) -> set[str]:
    """Every property path a resource body sets, '/'-joined ('properties/anonymousPullEnabled'): through object
    literals and the objects inside array literals and loops; a computed key (a dictionary entry) ends the path.
    Bicep's own keys (parent, scope, dependsOn) are not resource properties and are left out."""

    def walk(node: Node, prefix: str) -> set[str]:
        node = unwrap(node)[0] if node.type in {"for_statement", "if_statement"} else node
        found: set[str] = set()
        if node.type == "object":
            for key, value in object_items(node):
                if key is None or (not prefix and key in _RESOURCE_META):
                    continue
                path = f"{prefix}/{key}" if prefix else key
                found.add(path)
                found |= walk(value, path)
        elif node.type == "array":
            for item in code_children(node):
                found |= walk(item, prefix)
        return found

    return walk(resource.body, "")


# ---------------------------------------------------------------- azd: azure.yaml services, main.parameters.json

_AZD_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(=|:=|:-)([^}]*))?\}")


def azd_substitute(value: str, env: dict[str, str]) -> str:
    """`${VAR}` and `${VAR=default}` as azd expands a parameters file: drone/envsubst (funcs.go toDefault) gives the
    default when the variable is unset *or empty*, since azd's lookup returns "" for both (azure-dev
    cli/azd/pkg/infra/provisioning/bicep/bicep_provider.go, evalParamEnvSubst)."""
    return _AZD_VARIABLE.sub(lambda m: env.get(m.group(1), "") or (m.group(3) or ""), value)


def azd_parameters(env: dict[str, str]) -> dict[str, Any]:
    """main.parameters.json's values after azd's substitution with `env` (strings, nested in objects and arrays)."""

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return azd_substitute(node, env)
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, dict):
            return {key: walk(item) for key, item in node.items()}
        return node

    document = json.loads((INFRA / "main.parameters.json").read_text())
    return {name: walk(entry["value"]) for name, entry in document["parameters"].items()}


def azure_yaml_services() -> dict[str, dict[str, str]]:
    """Each service of azure.yaml: its settings with nested keys '/'-joined ('docker/path'). Line-based: the file is
    small, flat and has no YAML parser in the dev requirements."""
    services: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    parents: list[tuple[int, str]] = []
    inside = False
    for line in (REPO / "azure.yaml").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            inside = line.startswith("services:")
            continue
        if not inside:
            continue
        key, _, value = line.strip().partition(":")
        if depth == 2:
            current = services.setdefault(key, {})
            parents = []
            continue
        assert current is not None
        parents = [(d, k) for d, k in parents if d < depth]
        if value.strip():
            current["/".join([k for _, k in parents] + [key])] = value.strip().strip("'\"")
        else:
            parents.append((depth, key))
    return services
