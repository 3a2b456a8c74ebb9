"""The Bicep syntax tree of infra/ (tree-sitter-bicep, a dev dependency: import this module only to read infra/) and
an evaluator that reduces an expression to a Python value where it can, to `Opaque` (its source text) where the value
only exists at deployment time. No bicep CLI, no network. The one parser of infra/: the rights of the stand-ins
(`orderflow.embedded.rights`) and the infra tests (tests/support/bicep_tree.py) read the tree through it. What it
evaluates, in detail: docs/modules-product.md, section orderflow/embedded/rights/_bicep.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import tree_sitter_bicep
from tree_sitter import Language, Node, Parser

REPO = Path(__file__).resolve().parents[3]
INFRA = REPO / "infra"

_PARSER = Parser(Language(tree_sitter_bicep.language()))
_ESCAPES = {"\\'": "'", "\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t", "\\$": "$"}


@dataclass(frozen=True)
class Opaque:
    """An expression whose value exists only at deployment time (a reference, a function call)."""

    text: str


def text(node: Node) -> str:
    return node.text.decode() if node.text is not None else ""


def syntax_errors(root: Node) -> list[str]:
    """Every ERROR or MISSING node, as 'line:column kind text'."""
    found: list[str] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            kind = "MISSING" if node.is_missing else "ERROR"
            found.append(f"{node.start_point[0] + 1}:{node.start_point[1] + 1} {kind} {text(node)[:60]!r}")
        stack.extend(node.children)
    return found


def parse(source: bytes) -> Node:
    return _PARSER.parse(source).root_node


def object_items(obj: Node) -> Iterator[tuple[str | None, Node]]:
    """(key, value node) of each property of an `object` node, in order (nested resources are skipped)."""
    for prop in obj.named_children:
        if prop.type != "object_property":
            continue
        children = code_children(prop)
        key_node, value = children[0], children[-1]
        if key_node.type == "resource_declaration":
            continue
        yield string_value(key_node) if key_node.type == "string" else text(key_node), value


def code_children(node: Node) -> list[Node]:
    """Named children without comments."""
    return [child for child in node.named_children if child.type != "comment"]


def object_get(obj: Node | None, *path: str) -> Node | None:
    """The value node at `path` inside nested object literals, or None."""
    node = obj
    for key in path:
        if node is None or node.type != "object":
            return None
        node = next((value for k, value in object_items(node) if k == key), None)
    return node


def string_parts(node: Node, interpolation: Callable[[Node], str | None]) -> str | None:
    """A `string` node's text: literal parts as they read, each `${...}` as `interpolation(its expression node)`;
    None as soon as `interpolation` gives None."""
    parts: list[str] = []
    for child in node.named_children:
        if child.type == "string_content":
            parts.append(text(child))
        elif child.type == "escape_sequence":
            parts.append(_ESCAPES.get(text(child), text(child)))
        else:
            part = interpolation(child)
            if part is None:
                return None
            parts.append(part)
    return "".join(parts)


def string_value(node: Node) -> str | None:
    """The literal value of a `string` node, or None if it interpolates."""
    return string_parts(node, lambda _: None)


def loop_parts(node: Node) -> tuple[str, str | None, Node]:
    """A `for_statement`'s item variable, index variable (or None) and the expression it iterates."""
    first = node.named_children[0]
    if first.type == "for_loop_parameters":
        item, index = (text(child) for child in first.named_children[:2])
        return item, index, node.named_children[1]
    return text(first), None, node.named_children[1]


def unwrap(node: Node) -> tuple[Node, bool, Node | None]:
    """A declaration's value without its loop and condition: (body, is_loop, condition)."""
    loop, condition = False, None
    if node.type == "for_statement":
        loop = True
        node = node.named_children[-1]
    if node.type == "if_statement":
        condition = node.named_children[0]
        node = node.named_children[-1]
    return node, loop, condition


@dataclass
class Resource:
    symbol: str
    type: str
    api_version: str
    body: Node
    loop: bool
    condition: Node | None
    existing: bool
    parent: Resource | None
    file: BicepFile
    value: Node | None = None  # the declaration's value as written: its loop and condition included

    def get(self, *path: str) -> Node | None:
        return object_get(self.body, *path)


@dataclass
class Module:
    symbol: str
    source: str
    body: Node
    condition: Node | None
    file: BicepFile

    def params(self) -> dict[str, Node]:
        params = object_get(self.body, "params")
        return {key: value for key, value in object_items(params) if key is not None} if params is not None else {}

    def target(self) -> BicepFile | None:
        if self.source.startswith("br/") or self.source.startswith("br:"):
            return None
        return load(str((self.file.path.parent / self.source).resolve()), str(self.file.infra))


@dataclass
class BicepFile:
    path: Path
    root: Node
    infra: Path = INFRA  # the infra folder it belongs to (`name` is relative to it)
    params: dict[str, Node | None] = field(default_factory=dict)
    variables: dict[str, Node] = field(default_factory=dict)
    outputs: dict[str, Node] = field(default_factory=dict)
    resources: list[Resource] = field(default_factory=list)
    modules: list[Module] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.relative_to(self.infra).as_posix()

    def resource(self, symbol: str) -> Resource:
        matches = [r for r in self.resources if r.symbol == symbol]
        assert len(matches) == 1, f"{self.name}: resource {symbol!r} declared {len(matches)} times"
        return matches[0]

    def resources_of(self, type_name: str) -> list[Resource]:
        return [r for r in self.resources if r.type.lower() == type_name.lower()]

    def module(self, symbol: str) -> Module:
        return next(m for m in self.modules if m.symbol == symbol)


def _index_resource(bfile: BicepFile, decl: Node, parent: Resource | None) -> None:
    symbol = text(decl.named_children[0])
    type_literal = string_value(decl.named_children[1]) or ""
    type_name, _, api = type_literal.partition("@")
    if parent is not None and "/" not in type_name:
        type_name = f"{parent.type}/{type_name}"
        api = api or parent.api_version
    body, loop, condition = unwrap(decl.named_children[-1])
    existing = any(child.type == "existing" for child in decl.children)
    value = decl.named_children[-1]
    resource = Resource(symbol, type_name, api, body, loop, condition, existing, parent, bfile, value)
    bfile.resources.append(resource)
    for prop in body.named_children:
        nested = prop.named_children[0] if prop.type == "object_property" and prop.named_children else None
        if nested is not None and nested.type == "resource_declaration":
            _index_resource(bfile, nested, resource)


def _index(bfile: BicepFile) -> None:
    for decl in code_children(bfile.root):
        kind = decl.type
        if kind == "parameter_declaration":
            children = decl.named_children
            default = children[-1] if len(children) >= 3 else None
            bfile.params[text(children[0])] = default
        elif kind == "variable_declaration":
            bfile.variables[text(decl.named_children[0])] = decl.named_children[-1]
        elif kind == "output_declaration":
            bfile.outputs[text(decl.named_children[0])] = decl.named_children[-1]
        elif kind == "resource_declaration":
            _index_resource(bfile, decl, None)
        elif kind == "module_declaration":
            body, _, condition = unwrap(decl.named_children[-1])
            source = string_value(decl.named_children[1]) or ""
            bfile.modules.append(Module(text(decl.named_children[0]), source, body, condition, bfile))


@cache
def load(path: str, infra: str | None = None) -> BicepFile:
    """The file at `path`, of the infra folder `infra` (default: this repository's)."""
    file_path = Path(path)
    bfile = BicepFile(file_path, parse(file_path.read_bytes()), Path(infra) if infra else INFRA)
    _index(bfile)
    return bfile


def all_files(infra: Path = INFRA) -> list[BicepFile]:
    return [load(str(p), str(infra)) for p in sorted(infra.rglob("*.bicep"))]


def main(infra: Path = INFRA) -> BicepFile:
    return load(str(infra / "main.bicep"), str(infra))


def app(name: str, infra: Path = INFRA) -> BicepFile:
    return load(str(infra / "app" / name), str(infra))


# ---------------------------------------------------------------- evaluation


# everything: a deployment as Azure Resource Manager runs it
DEPLOYED = frozenset({"empty", "concat", "contains", "join", "==", "for"})


@dataclass(frozen=True)
class Scope:
    """Where identifiers resolve: a file, plus the parameter values its caller passes (node, caller scope).
    `functions`: what evaluate reduces beyond literals, `union` and `!`, each off unless asked for (`DEPLOYED`):
    `empty`, `concat`, `contains`, `join`, comparisons and `??` ("=="), `for` expressions and `a[i]` ("for").
    `values`: loop variables bound to Python values (`for app in submittingApps`), innermost first."""

    file: BicepFile
    passed: tuple[tuple[str, Node, Scope], ...] = ()
    functions: frozenset[str] = frozenset()
    values: tuple[tuple[str, Any], ...] = ()

    def with_value(self, name: str, value: Any) -> Scope:
        return Scope(self.file, self.passed, self.functions, ((name, value), *self.values))

    def bound(self, name: str) -> tuple[Node, Scope] | None:
        return next(((node, scope) for key, node, scope in self.passed if key == name), None)


def module_scope(caller: Scope, module: Module) -> Scope:
    """The scope of a module's file as `caller` invokes it."""
    target = module.target()
    assert target is not None, f"{module.symbol} is a registry module"
    return Scope(target, tuple((key, node, caller) for key, node in module.params().items()), caller.functions)


def evaluate(node: Node | None, scope: Scope) -> Any:
    if node is None:
        return None
    kind = node.type
    if kind == "string":
        literal = string_value(node)
        if literal is None and "for" in scope.functions:
            literal = string_parts(node, lambda part: _interpolated(evaluate(part.named_children[0], scope)))
        return literal if literal is not None else Opaque(text(node))
    if kind == "number":
        return int(text(node))
    if kind == "boolean":
        return text(node) == "true"
    if kind == "null":
        return None
    if kind == "object":
        return {key: evaluate(value, scope) for key, value in object_items(node)}
    if kind == "array":
        return [evaluate(item, scope) for item in code_children(node)]
    if kind == "parenthesized_expression":
        return evaluate(node.named_children[0], scope)
    if kind == "identifier":
        return _identifier(text(node), scope, node)
    if kind == "call_expression":
        return _call(node, scope)
    if kind == "ternary_expression":
        return _ternary(node, scope)
    if kind == "member_expression":
        return _member(node, scope)
    if kind == "unary_expression":
        return _unary(node, scope)
    if kind == "binary_expression" and "==" in scope.functions:
        return _binary(node, scope)
    if kind == "for_statement" and "for" in scope.functions:
        return _for(node, scope)
    if kind == "subscript_expression" and "for" in scope.functions:
        items, index = (evaluate(child, scope) for child in code_children(node))
        if isinstance(items, list) and isinstance(index, int) and 0 <= index < len(items):
            return items[index]
    return Opaque(text(node))


def _interpolated(value: Any) -> str | None:
    """A reduced value as `${...}` writes it into a string; None when it did not reduce."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, str | int) else None


def _binary(node: Node, scope: Scope) -> Any:
    """`a == b`, `a != b` of reduced values, `a ?? b`, `a && b`, `a || b` of booleans; Opaque otherwise."""
    left_node, right_node = code_children(node)
    operator = next(child.type for child in node.children if not child.is_named)
    left = evaluate(left_node, scope)
    if operator == "??":
        return evaluate(right_node, scope) if left is None else left
    right = evaluate(right_node, scope)
    if isinstance(left, Opaque) or isinstance(right, Opaque):
        return Opaque(text(node))
    if operator in ("==", "!="):
        return (left == right) == (operator == "==")
    if operator in ("&&", "||") and isinstance(left, bool) and isinstance(right, bool):
        return (left and right) if operator == "&&" else (left or right)
    return Opaque(text(node))


def _for(node: Node, scope: Scope) -> Any:
    """`[for x in items: body]` and `[for (x, i) in items: body]`, with `if (c)` bodies left out when `c` is false."""
    item, index, iterable = loop_parts(node)
    items = evaluate(iterable, scope)
    if not isinstance(items, list):
        return Opaque(text(node))
    body, _, condition = unwrap(node)
    found = []
    for i, value in enumerate(items):
        inner = scope.with_value(item, value)
        inner = inner.with_value(index, i) if index else inner
        if condition is not None and evaluate(condition, inner) is not True:
            continue
        found.append(evaluate(body, inner))
    return found


def _unary(node: Node, scope: Scope) -> Any:
    """`!x` when `x` reduces to a boolean; Opaque otherwise."""
    operator, argument = node.children[0].type, node.named_children[-1]
    value = evaluate(argument, scope)
    if operator == "!" and isinstance(value, bool):
        return not value
    return Opaque(text(node))


def _module_output(node: Node, scope: Scope) -> Any:
    """`mod.outputs.name`: the module's output expression, evaluated in the module as `scope` invokes it; None if
    `node` is not such a reference."""
    target, key = node.named_children[0], node.named_children[-1]
    if target.type != "member_expression" or text(target.named_children[-1]) != "outputs":
        return None
    symbol = text(target.named_children[0])
    module = next((m for m in scope.file.modules if m.symbol == symbol), None)
    if module is None or module.target() is None:
        return None
    inner = module_scope(scope, module)
    output = inner.file.outputs.get(text(key))
    return evaluate(output, inner) if output is not None else None


def _member(node: Node, scope: Scope) -> Any:
    """`obj.key` when `obj` reduces to an object that has `key` (e.g. a variable built with union()); Opaque
    otherwise (a module output, a resource property, a missing key)."""
    target, key = node.named_children[0], node.named_children[-1]
    if key.type != "property_identifier":
        return Opaque(text(node))
    output = _module_output(node, scope)
    if output is not None and not isinstance(output, Opaque):
        return output
    value = evaluate(target, scope)
    if isinstance(value, dict) and text(key) in value:
        return value[text(key)]
    if isinstance(value, dict) and any(child.type == ".?" for child in node.children):
        return None  # `obj.?key`: the safe dereference of a missing key
    return Opaque(text(node))


def _identifier(name: str, scope: Scope, node: Node) -> Any:
    for key, value in scope.values:
        if key == name:
            return value
    bound = scope.bound(name)
    if bound is not None:
        return evaluate(bound[0], bound[1])
    if name in scope.file.variables:
        return evaluate(scope.file.variables[name], scope)
    if name in scope.file.params and scope.file.params[name] is not None:
        return evaluate(scope.file.params[name], scope)
    return Opaque(text(node))


def _call(node: Node, scope: Scope) -> Any:
    function = text(node.named_children[0])
    args = [evaluate(a, scope) for a in node.named_children[-1].named_children]
    if function == "union" and args and all(isinstance(a, dict) for a in args):
        merged: dict[str, Any] = {}
        for arg in args:
            merged.update(arg)
        return merged
    if function == "empty" and "empty" in scope.functions and len(args) == 1 and not isinstance(args[0], Opaque):
        return not args[0]
    if function == "concat" and "concat" in scope.functions and args and all(isinstance(a, list) for a in args):
        return [item for arg in args for item in arg]
    if function in scope.functions and function in _COLLECTION_CALLS and len(args) == 2:
        value = None if any(isinstance(a, Opaque) for a in args) else _COLLECTION_CALLS[function](args)
        return Opaque(text(node)) if value is None else value
    return Opaque(text(node))


def _contains(args: list[Any]) -> Any:
    """`contains(container, item)`: an array's element, an object's key, a string's substring; strings compare
    case-sensitively, object keys case-insensitively (ARM template functions reference, contains)."""
    container, item = args
    if isinstance(container, dict) and isinstance(item, str):
        return item.lower() in {str(key).lower() for key in container}
    if isinstance(container, list) or (isinstance(container, str) and isinstance(item, str)):
        return item in container
    return None


def _join(args: list[Any]) -> Any:
    """`join(array of strings, delimiter)`."""
    items, delimiter = args
    if isinstance(items, list) and all(isinstance(i, str) for i in items) and isinstance(delimiter, str):
        return delimiter.join(items)
    return None


_COLLECTION_CALLS: dict[str, Callable[[list[Any]], Any]] = {"contains": _contains, "join": _join}


def _ternary(node: Node, scope: Scope) -> Any:
    """`c ? a : b` when `c` reduces to a boolean (a bool parameter such as vnetEnabled, as passed or defaulted);
    Opaque otherwise (a comparison or a function call is not evaluated)."""
    condition, when_true, when_false = code_children(node)
    chosen = evaluate(condition, scope)
    if isinstance(chosen, bool):
        return evaluate(when_true if chosen else when_false, scope)
    return Opaque(text(node))


def literal(source: str) -> Node:
    """The expression node of a Bicep literal, e.g. literal('true'): a value to bind in a Scope's `passed`."""
    declaration = parse(f"var v = {source}\n".encode()).named_children[0]
    return declaration.named_children[-1]


def with_params(scope: Scope, **values: str) -> Scope:
    """`scope` with parameters bound to Bicep literals, as if passed: with_params(Scope(main()), vnetEnabled='true')."""
    bound = tuple((name, literal(source), scope) for name, source in values.items())
    return Scope(scope.file, bound + scope.passed, scope.functions)


def bicep_literal(value: Any) -> str:
    """The Bicep source of a JSON value (a parameters file's `value`): strings quoted, objects and arrays multi-line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${") + "'"
    if isinstance(value, list):
        return "[\n" + "".join(f"{bicep_literal(item)}\n" for item in value) + "]"
    if isinstance(value, dict):
        return "{\n" + "".join(f"'{key}': {bicep_literal(item)}\n" for key, item in value.items()) + "}"
    raise TypeError(f"not a JSON value: {value!r}")


def with_values(scope: Scope, values: dict[str, Any]) -> Scope:
    """`scope` with parameters bound to JSON values, as a parameters file passes them."""
    return with_params(scope, **{name: bicep_literal(value) for name, value in values.items()})
