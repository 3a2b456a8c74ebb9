"""Every role assignment of infra/ (roleAssignments and Cosmos DB sqlRoleAssignments) as a `Grant`: the identity,
the role with its actions and data actions, the resource it is scoped to, read from the Bicep tree (`_bicep`) as
main.bicep deploys it. Imports tree-sitter: loaded only when rights are checked. Sources: docs/modules-product.md,
section orderflow/embedded/rights/_grants.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tree_sitter import Node

from ._bicep import (
    DEPLOYED,
    BicepFile,
    Opaque,
    Resource,
    Scope,
    code_children,
    evaluate,
    load,
    loop_parts,
    module_scope,
    string_parts,
    text,
    with_values,
)
from ._model import AGENT, FUNCTION_APP, OPERATORS, SIMULATOR, Grant, Role

ROLE_ASSIGNMENT = "Microsoft.Authorization/roleAssignments"
SQL_ROLE_ASSIGNMENT = "Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments"
SQL_ROLE_DEFINITION = "Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions"
QUEUE = "Microsoft.ServiceBus/namespaces/queues"
NAMESPACE = "Microsoft.ServiceBus/namespaces"
_SB = "Microsoft.ServiceBus"
# Azure's built-in roles by GUID, with the data actions the stand-ins check (Service Bus and Cosmos DB) and Reader's
# `*/read`; the others by name only (no stand-in checks them). https://learn.microsoft.com/azure/role-based-access-
# control/built-in-roles/integration (Service Bus), .../built-in-roles/general (Reader).
BUILT_IN_ROLES: dict[str, Role] = {
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": Role(
        "Service Bus Data Receiver", data_actions=(f"{_SB}/*/receive/action",)
    ),
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": Role("Service Bus Data Sender", data_actions=(f"{_SB}/*/send/action",)),
    "090c5cfd-751d-490a-894a-3ce6f1109419": Role("Service Bus Data Owner", (f"{_SB}/*",), (f"{_SB}/*",)),
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": Role("Reader", ("*/read",)),
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": Role("Storage Blob Data Owner"),
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": Role("Storage Queue Data Contributor"),
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": Role("Storage Table Data Contributor"),
    "3913510d-42f4-4e42-8a64-420c390055eb": Role("Monitoring Metrics Publisher"),
    "7f951dda-4ed3-4680-a7ca-43fe172d538d": Role("AcrPull"),
    "0ad04412-c4d5-4796-b79c-f76d14c8d402": Role("Durable Task Data Contributor"),
}
_COSMOS = "Microsoft.DocumentDB/databaseAccounts"
# Cosmos DB's built-in data-plane roles (sqlRoleDefinitions):
# https://learn.microsoft.com/azure/cosmos-db/nosql/security/reference-data-plane-roles
COSMOS_BUILT_IN_ROLES: dict[str, Role] = {
    "00000000-0000-0000-0000-000000000001": Role(
        "Cosmos DB Built-in Data Reader",
        data_actions=(
            f"{_COSMOS}/readMetadata",
            f"{_COSMOS}/sqlDatabases/containers/executeQuery",
            f"{_COSMOS}/sqlDatabases/containers/readChangeFeed",
            f"{_COSMOS}/sqlDatabases/containers/items/read",
        ),
    ),
    "00000000-0000-0000-0000-000000000002": Role(
        "Cosmos DB Built-in Data Contributor",
        data_actions=(
            f"{_COSMOS}/readMetadata",
            f"{_COSMOS}/sqlDatabases/containers/*",
            f"{_COSMOS}/sqlDatabases/containers/items/*",
        ),
    ),
}
# The principal expressions of infra/ and the local identity each one is; a submitting application (`app.principalId`
# in a loop over submittingApps) is its own name.
PRINCIPALS = {
    "appPrincipalId": FUNCTION_APP,
    "agentPrincipalId": AGENT,
    "operatorPrincipalId": OPERATORS,
    "identity.properties.principalId": SIMULATOR,
}


# Submitting applications the local system has beyond main.parameters.json's: the second tenant of the multi-tenant
# drill (SubmittingApps `app,partner`), whose queues partner-orders and partner-status servicebus.config.json holds.
# They come after main.parameters.json's, so the legacy app (legacyOrdersApp's default: the first app) stays `app`.
LOCAL_APPS = ("partner",)


def local_deployment(infra: Path) -> Scope:
    """main.bicep as the local system deploys it: its defaults, the submitting applications of main.parameters.json
    (what azd deploys) followed by `LOCAL_APPS`, and every optional principal configured (a principal id is a
    placeholder: its identity)."""
    main = load(str(infra / "main.bicep"), str(infra))
    parameters = json.loads((infra / "main.parameters.json").read_text())["parameters"]
    apps = [{**app, "principalId": app["name"]} for app in parameters["submittingApps"]["value"]]
    apps += [{"name": name, "principalId": name} for name in LOCAL_APPS if name not in {a["name"] for a in apps}]
    return with_values(Scope(main, functions=DEPLOYED), {"submittingApps": apps, "operatorPrincipalId": OPERATORS})


def grants(infra: Path) -> list[Grant]:
    """Every role assignment main.bicep deploys locally, through its modules (those whose condition holds)."""
    return deployment_grants(local_deployment(infra))


def deployment_grants(deployment: Scope) -> list[Grant]:
    """Every role assignment of main.bicep deployed with the parameters `deployment` passes (e.g. another set of
    submitting applications), through its modules whose condition holds."""
    return list(_file_grants(deployment))


def _file_grants(scope: Scope) -> Iterator[Grant]:
    for resource in scope.file.resources:
        if resource.type in (ROLE_ASSIGNMENT, SQL_ROLE_ASSIGNMENT):
            for inner in _instances(resource, scope):
                yield _grant(resource, inner)
    for module in scope.file.modules:
        if module.target() is None or not _holds(module.condition, scope, f"module {module.symbol}"):
            continue
        yield from _file_grants(module_scope(scope, module))


def _instances(resource: Resource, scope: Scope) -> Iterator[Scope]:
    """The scopes of a declaration's instances (one per loop item) whose condition holds."""
    value = resource.value
    scopes = [scope]
    if value is not None and value.type == "for_statement":
        item, index, iterable = loop_parts(value)
        items = _known(evaluate(iterable, scope), resource, "its loop")
        scopes = []
        for i, each in enumerate(items):
            inner = scope.with_value(item, each)
            scopes.append(inner.with_value(index, i) if index else inner)
    for inner in scopes:
        if _holds(resource.condition, inner, resource.symbol):
            yield inner


def _known(value: Any, resource: Resource | None, what: str) -> Any:
    if isinstance(value, Opaque) or value is None:
        where = f"{resource.file.name}: {resource.symbol}" if resource else "infra"
        raise ValueError(f"{where}: cannot evaluate {what} ({value}); the rights need a value known before deployment")
    return value


def _holds(condition: Node | None, scope: Scope, what: str) -> bool:
    if condition is None:
        return True
    value = evaluate(condition, scope)
    if not isinstance(value, bool):
        raise ValueError(
            f"{scope.file.name}: the condition of {what} does not reduce to true or false: {text(condition)}"
        )
    return value


def _grant(resource: Resource, scope: Scope) -> Grant:
    where = f"{resource.file.name}:{resource.body.start_point[0] + 1} {resource.symbol}"
    identity = _identity(resource, scope)
    if resource.type == SQL_ROLE_ASSIGNMENT:
        role = _sql_role(resource, scope)
        path = _cosmos_path(resource.get("properties", "scope"), scope, resource)
        return Grant(identity, role, "cosmos", path or "/", where)
    role_id = _role_guid(resource, scope)
    if role_id not in BUILT_IN_ROLES:
        raise ValueError(f"{where}: role {role_id} is not a built-in role this table knows")
    service, target = _target(resource, scope)
    return Grant(identity, BUILT_IN_ROLES[role_id], service, target, where)


def _identity(resource: Resource, scope: Scope) -> str:
    node = resource.get("properties", "principalId")
    source = text(node) if node is not None else ""
    if node is not None and node.type == "member_expression" and source.endswith(".principalId"):
        holder = evaluate(node.named_children[0], scope)
        if isinstance(holder, dict) and isinstance(holder.get("name"), str):
            return str(holder["name"])  # a submitting application
    if source not in PRINCIPALS:
        raise ValueError(f"{resource.file.name}: {resource.symbol} grants {source!r}, which names no local identity")
    return PRINCIPALS[source]


def _role_guid(resource: Resource, scope: Scope) -> str:
    """The GUID of roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', <guid>)."""
    call = resource.get("properties", "roleDefinitionId")
    if call is None or call.type != "call_expression" or text(call.named_children[0]) != "subscriptionResourceId":
        raise ValueError(
            f"{resource.file.name}: {resource.symbol}: roleDefinitionId is not subscriptionResourceId(...)"
        )
    return str(_known(evaluate(call.named_children[-1].named_children[-1], scope), resource, "its role"))


def _accounts(file: BicepFile) -> set[str]:
    return {r.symbol for r in file.resources if r.type == _COSMOS}


def _cosmos_path(node: Node | None, scope: Scope, resource: Resource) -> str:
    """A Cosmos DB data-plane path (`/dbs/<db>/colls/<container>`, `/sqlRoleDefinitions/<id>`) relative to the
    account: the account's `.id` reads as the empty string."""
    if node is None or node.type != "string":
        raise ValueError(f"{resource.file.name}: {resource.symbol}: a Cosmos DB scope must be a string")
    accounts = _accounts(resource.file)

    def part(interpolation: Node) -> str | None:
        expression = interpolation.named_children[0]
        if expression.type == "member_expression" and text(expression.named_children[-1]) == "id":
            if text(expression.named_children[0]) in accounts:
                return ""
        value = evaluate(expression, scope)
        return None if isinstance(value, Opaque) else str(value)

    path = string_parts(node, part)
    return str(_known(path, resource, f"the path {text(node)}"))


def _sql_role(resource: Resource, scope: Scope) -> Role:
    node = resource.get("properties", "roleDefinitionId")
    if node is not None and node.type == "member_expression" and text(node.named_children[-1]) == "id":
        definition = resource.file.resource(text(node.named_children[0]))
        if definition.type != SQL_ROLE_DEFINITION:
            raise ValueError(f"{resource.file.name}: {resource.symbol}: {text(node)} is not a sqlRoleDefinition")
        permissions = _known(evaluate(definition.get("properties", "permissions"), scope), definition, "permissions")
        actions = [a for p in permissions for a in p.get("dataActions", [])]
        name_node = definition.get("properties", "roleName")
        name = string_parts(name_node, lambda e: str(evaluate(e.named_children[0], scope))) if name_node else None
        return Role(str(name or definition.symbol), data_actions=tuple(actions))
    path = _cosmos_path(node, scope, resource)
    guid = path.rsplit("/", 1)[-1]
    if guid not in COSMOS_BUILT_IN_ROLES:
        raise ValueError(f"{resource.file.name}: {resource.symbol}: {path} is not a Cosmos DB built-in role")
    return COSMOS_BUILT_IN_ROLES[guid]


def _target(assignment: Resource, scope: Scope) -> tuple[str, str]:
    """(service, resource) of a role assignment's `scope`: ("servicebus", queue name) for a queue, ("servicebus", "")
    for the namespace, (resource type, symbol) for anything else."""
    node = assignment.get("scope")
    if node is None:
        return "resourceGroup", ""
    index: int | None = None
    if node.type == "subscript_expression":
        target_node, index_node = code_children(node)
        index = _known(evaluate(index_node, scope), assignment, f"the index {text(node)}")
        node = target_node
    target = _resource(assignment.file, node)
    if target.type == NAMESPACE:
        return "servicebus", ""
    if target.type != QUEUE:
        return target.type, target.symbol
    names = [_known(evaluate(target.get("name"), inner), target, "its name") for inner in _instances(target, scope)]
    if target.value is not None and target.value.type == "for_statement":
        if index is None:
            raise ValueError(f"{assignment.file.name}: {assignment.symbol}: a loop of queues needs an index")
        return "servicebus", str(names[index])
    return "servicebus", str(names[0])


def _resource(file: BicepFile, node: Node) -> Resource:
    """The resource a symbol (`storage`) or a nested accessor (`namespace::ordersQueue`) names."""
    if node.type == "resource_expression":
        parent, child = (text(n) for n in code_children(node))
        matches = [r for r in file.resources if r.symbol == child and r.parent and r.parent.symbol == parent]
        if len(matches) == 1:
            return matches[0]
    elif node.type == "identifier":
        return file.resource(text(node))
    raise ValueError(f"{file.name}: cannot resolve the scope {text(node)}")
