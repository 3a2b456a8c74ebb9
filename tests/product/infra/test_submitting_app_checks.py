"""main.bicep refuses, with Bicep's fail() before anything is deployed, the submittingApps the code would refuse or
that would merge two tenants: an app name outside orderflow/apps.py's rule (APP_NAME_PATTERN, and not 'none'), a name
given twice, and two apps with one non-empty principalId (issue 25 review). Bicep has no regex, so the name rule is
built from string functions; the checks are evaluated here, as ARM would, by a small evaluator of exactly the
functions they use (the shared one, orderflow/embedded/rights/_bicep.py, leaves calls like toLower or reduce opaque),
and compared name by name with the code's own valid_app_name.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from support.bicep_tree import (
    Opaque,
    Scope,
    azd_parameters,
    code_children,
    evaluate,
    loop_parts,
    main,
    object_items,
    string_parts,
    text,
    unwrap,
)
from tree_sitter import Node

from orderflow import apps

CHECKS = ("appNamesAccepted", "appNamesDistinct", "appPrincipalsDistinct")


# ---------------------------------------------------------------- an evaluator of the checks, as ARM runs them


class BicepFailed(Exception):
    """fail(message) was evaluated: ARM stops the deployment with this message."""


@dataclass(frozen=True)
class Env:
    params: dict[str, Any]
    local: dict[str, Any] = field(default_factory=dict)

    def bind(self, **values: Any) -> Env:
        return Env(self.params, {**self.local, **values})


def _ci_find(haystack: str, needle: str) -> int:
    return haystack.lower().find(needle.lower())


# ARM template functions (learn.microsoft.com/azure/azure-resource-manager/templates/template-functions-string, -array,
# -lambda): contains compares strings case-sensitively, indexOf/startsWith/endsWith case-insensitively.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "toLower": lambda s: s.lower(),
    "toUpper": lambda s: s.upper(),
    "length": len,
    "empty": lambda x: x is None or len(x) == 0,
    "contains": lambda c, item: item.lower() in {k.lower() for k in c} if isinstance(c, dict) else item in c,
    "take": lambda x, n: x[: max(n, 0)],
    "skip": lambda x, n: x[max(n, 0) :],
    "range": lambda start, count: list(range(start, start + count)),
    "replace": lambda s, old, new: s.replace(old, new),
    "join": lambda items, delimiter: delimiter.join(items),
    "startsWith": lambda s, prefix: s.lower().startswith(prefix.lower()),
    "endsWith": lambda s, suffix: s.lower().endswith(suffix.lower()),
    "indexOf": lambda s, item: (s.index(item) if item in s else -1) if isinstance(s, list) else _ci_find(s, item),
    "reduce": lambda items, initial, f: _reduce(items, initial, f),
    "filter": lambda items, f: [item for item in items if f(item) is True],
    "map": lambda items, f: [f(item) for item in items],
}


def _reduce(items: list[Any], initial: Any, f: Callable[[Any, Any], Any]) -> Any:
    value = initial
    for item in items:
        value = f(value, item)
    return value


def _substring(s: str, start: int, length: int) -> str:
    assert 0 <= start and 0 <= length and start + length <= len(s), "ARM: substring out of range"
    return s[start : start + length]


FUNCTIONS["substring"] = _substring


def _string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    assert isinstance(value, str | int), value
    return str(value)


def run(node: Node, env: Env) -> Any:
    """The value ARM computes for `node`, or BicepFailed; any construct outside the checks' subset is an error here
    (the test must not guess)."""
    kind = node.type
    if kind == "string":
        return string_parts(node, lambda part: _string(run(part.named_children[0], env)))
    if kind == "number":
        return int(text(node))
    if kind == "boolean":
        return text(node) == "true"
    if kind == "null":
        return None
    if kind == "array":
        return [run(item, env) for item in code_children(node)]
    if kind == "object":
        return {key: run(value, env) for key, value in object_items(node)}
    if kind == "parenthesized_expression":
        return run(node.named_children[0], env)
    if kind == "identifier":
        return _identifier(text(node), env)
    if kind == "ternary_expression":
        condition, when_true, when_false = code_children(node)
        chosen = run(condition, env)
        assert isinstance(chosen, bool), text(condition)
        return run(when_true if chosen else when_false, env)
    if kind == "unary_expression":
        value = run(node.named_children[-1], env)
        assert node.children[0].type == "!" and isinstance(value, bool), text(node)
        return not value
    if kind == "binary_expression":
        return _binary(node, env)
    if kind == "member_expression":
        target, key = node.named_children[0], node.named_children[-1]
        value = run(target, env)
        assert isinstance(value, dict), text(node)
        safe = any(child.type == ".?" for child in node.children)
        return value.get(text(key)) if safe else value[text(key)]
    if kind == "subscript_expression":
        items, index = (run(child, env) for child in code_children(node))
        return items[index]
    if kind == "call_expression":
        return _call(node, env)
    if kind == "lambda_expression":
        return _lambda(node, env)
    if kind == "for_statement":
        return _for(node, env)
    raise NotImplementedError(f"{kind}: {text(node)[:80]}")


def _identifier(name: str, env: Env) -> Any:
    if name in env.local:
        return env.local[name]
    if name in env.params:
        return env.params[name]
    bicep = main()
    if name in bicep.variables:
        return run(bicep.variables[name], Env(env.params))
    default = bicep.params.get(name)
    if default is not None:
        return run(default, Env(env.params))
    raise NotImplementedError(f"{name}: not a parameter value, variable or default the checks may use")


def _binary(node: Node, env: Env) -> Any:
    left_node, right_node = code_children(node)
    operator = next(child.type for child in node.children if not child.is_named)
    left = run(left_node, env)
    if operator in ("&&", "||"):
        assert isinstance(left, bool), text(left_node)
        if left is (operator == "||"):
            return left
        right = run(right_node, env)
        assert isinstance(right, bool), text(right_node)
        return right
    if operator == "??":
        return run(right_node, env) if left is None else left
    right = run(right_node, env)
    comparisons: dict[str, Callable[[Any, Any], bool]] = {
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
        "=~": lambda a, b: a.lower() == b.lower(),
        "!~": lambda a, b: a.lower() != b.lower(),
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b,
    }
    return comparisons[operator](left, right)


def _call(node: Node, env: Env) -> Any:
    name = text(node.named_children[0])
    args = [run(arg, env) for arg in code_children(node.named_children[-1])]
    if name == "fail":
        raise BicepFailed(args[0])
    if name not in FUNCTIONS:
        raise NotImplementedError(f"{name}(): not a function the checks may use")
    return FUNCTIONS[name](*args)


def _lambda(node: Node, env: Env) -> Callable[..., Any]:
    params, body = node.named_children[0], node.named_children[-1]
    names = [text(params)] if params.type == "identifier" else [text(c) for c in code_children(params)]
    return lambda *values: run(body, env.bind(**dict(zip(names, values, strict=True))))


def _for(node: Node, env: Env) -> list[Any]:
    item, index, iterable = loop_parts(node)
    body, _, condition = unwrap(node)
    found = []
    for i, value in enumerate(run(iterable, env)):
        inner = env.bind(**{item: value, **({index: i} if index else {})})
        if condition is None or run(condition, inner) is True:
            found.append(run(body, inner))
    return found


def refusal(submitting_apps: list[dict[str, str]]) -> str | None:
    """The message of the first check that fails for these submittingApps; None when all pass."""
    env = Env({"submittingApps": submitting_apps})
    for check in CHECKS:
        try:
            assert run(main().variables[check], env) is True
        except BicepFailed as failed:
            return str(failed)
    return None


def _app(name: str, principal: str = "") -> dict[str, str]:
    return {"name": name, "principalId": principal, "principalType": "ServicePrincipal"}


def _code_accepts(name: str) -> bool:
    try:
        apps.valid_app_name(name)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- the checks


def test_each_check_is_a_fail_of_the_parameters_alone() -> None:
    """Each check is `<condition> ? true : fail(...)` over parameters and variables only (no resource, no module
    output): ARM evaluates it when it validates the template, before any resource is deployed. The shared evaluator
    cannot reduce it (it leaves the deployment's other values alone)."""
    source = (main().path).read_text()
    for check in CHECKS:
        node = main().variables[check]
        assert node.type == "ternary_expression", check
        condition, when_true, when_false = code_children(node)
        assert text(when_true) == "true" and text(when_false).startswith("fail('submittingApps"), check
        assert f"#disable-next-line no-unused-vars\nvar {check} =" in source, check
        assert isinstance(evaluate(node, Scope(main())), Opaque)
    # What azd passes (main.parameters.json), and main.bicep's own default, pass.
    azd = azd_parameters({"AZURE_PRINCIPAL_ID": "p-1", "AZURE_PRINCIPAL_TYPE": "User"})
    assert refusal(azd["submittingApps"]) is None
    assert refusal(run(main().params["submittingApps"], Env({}))) is None


NAMES = [
    "app",
    "a",
    "shop",
    "b2b-gateway",
    "x--y",
    "a-",
    "a" * 24,
    "a" * 25,
    "z9" * 12,
    "none",
    "None",
    "nonE",
    "nones",
    "Shop",
    "shoP",
    "1app",
    "-app",
    "app_1",
    "app.x",
    "app x",
    " app",
    "app\n",
    "é",
    "appé",
    "appß",
    "appİ",
    "ı",
    "K",  # the Kelvin sign: lower-cases to k
]


@pytest.mark.parametrize("name", NAMES, ids=[repr(n) for n in NAMES])
def test_an_app_name_is_refused_exactly_when_the_code_refuses_it(name: str) -> None:
    message = refusal([_app("app"), _app(name)] if name != "app" else [_app(name)])
    if _code_accepts(name):
        assert message is None, name
    else:
        assert message is not None and f"'{name}'" in message and "orderflow/apps.py" in message, (name, message)


def test_random_app_names_get_the_codes_verdict() -> None:
    allowed, other = "abcxyz0189-", "_A.Z é/'"
    rng = random.Random(25)
    verdicts = []
    for i in range(600):
        name = rng.choice("abz") + "".join(rng.choice(allowed) for _ in range(rng.randint(0, 25)))
        if i % 3 == 1:  # one character the rule does not allow, anywhere
            at = rng.randint(0, len(name))
            name = name[:at] + rng.choice(other) + name[at + 1 :]
        elif i % 3 == 2:  # anything
            name = "".join(rng.choice(allowed + other) for _ in range(rng.randint(1, 26)))
        refused = refusal([_app(name)]) is not None
        assert refused is not _code_accepts(name), name
        verdicts.append(refused)
    assert 150 < verdicts.count(False) < 450  # both verdicts, many times


def test_an_app_named_twice_fails_the_deployment() -> None:
    message = refusal([_app("shop", "p-1"), _app("partner", "p-2"), _app("shop", "p-3")])
    assert message is not None and "more than once" in message and "'shop'" in message
    assert refusal([_app("shop", "p-1"), _app("partner", "p-2")]) is None


@pytest.mark.parametrize(
    "second",
    ["6f1c2d3e-0000-4000-8000-00000000000a", "6F1C2D3E-0000-4000-8000-00000000000A"],
    ids=["same", "same-other-case"],
)
def test_two_apps_with_one_principal_fail_the_deployment(second: str) -> None:
    shop = _app("shop", "6f1c2d3e-0000-4000-8000-00000000000a")
    message = refusal([shop, _app("partner", second), _app("b2b", "7a000000-0000-4000-8000-000000000001")])
    assert message is not None and "'partner'" in message and "its own identity" in message
    assert "'shop'" not in message  # the first holder of the id is not the one to blame


def test_apps_without_a_principal_or_with_their_own_pass() -> None:
    assert refusal([_app("shop"), _app("partner"), _app("b2b")]) is None
    assert refusal([_app("shop", "p-1"), _app("partner", "p-2"), _app("b2b")]) is None
