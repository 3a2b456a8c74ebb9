"""Infra RBAC: each role assignment's role, principal and scope, read from the tree, equals the least-
privilege table (rbac.bicep's header); names are guid(scope, principal, role); Cosmos grants are data-plane
sqlRoleAssignments: the built-in Data Contributor for the app, per database; for the Agent (issue 11) one custom
role on the circuit-breaker container only, with exactly the data actions the breaker uses.
"""

from __future__ import annotations

import ast
import re
from collections import Counter

from support.bicep_tree import REPO, Resource, Scope, all_files, app, evaluate, main, module_scope, text
from support.infra_rules import ROLE_NAMES, assignments, role_id

from orderflow import settings

# (scope symbol, role, principal expression) for every Azure RBAC assignment in infra/.
EXPECTED = Counter(
    [
        ("namespace::ordersQueue", "Service Bus Data Receiver", "appPrincipalId"),  # while there is a legacy app
        ("inboundQueues[i]", "Service Bus Data Receiver", "appPrincipalId"),
        ("namespace::agentRequestsQueue", "Service Bus Data Sender", "appPrincipalId"),
        ("namespace::agentRepliesQueue", "Service Bus Data Receiver", "appPrincipalId"),
        ("namespace::operatorAlertsQueue", "Service Bus Data Sender", "appPrincipalId"),
        ("statusQueues[i]", "Service Bus Data Sender", "appPrincipalId"),
        # The ops summary's dead-letter depths: each queue's runtime counts (control plane), no message, no key.
        ("namespace::ordersQueue", "Reader", "appPrincipalId"),
        ("namespace::agentRequestsQueue", "Reader", "appPrincipalId"),
        ("namespace::agentRepliesQueue", "Reader", "appPrincipalId"),
        ("namespace::operatorAlertsQueue", "Reader", "appPrincipalId"),
        ("inboundQueues[i]", "Reader", "appPrincipalId"),
        ("statusQueues[i]", "Reader", "appPrincipalId"),
        ("storage", "Storage Blob Data Owner", "appPrincipalId"),
        ("storage", "Storage Queue Data Contributor", "appPrincipalId"),
        ("storage", "Storage Table Data Contributor", "appPrincipalId"),
        ("applicationInsights", "Monitoring Metrics Publisher", "appPrincipalId"),
        ("namespace::agentRequestsQueue", "Service Bus Data Receiver", "agentPrincipalId"),
        ("namespace::agentRepliesQueue", "Service Bus Data Sender", "agentPrincipalId"),
        ("namespace::operatorAlertsQueue", "Service Bus Data Sender", "agentPrincipalId"),
        ("registry", "AcrPull", "agentPrincipalId"),
        # simulator.bicep (only without AGENT_REMOTE_URL): its own identity pulls its image, nothing else.
        ("registry", "AcrPull", "identity.properties.principalId"),
        ("applicationInsights", "Monitoring Metrics Publisher", "agentPrincipalId"),
        # Each submitting app: its own inbound and status queue; the legacy app also orders-inbound (issue 25).
        ("inboundQueues[i]", "Service Bus Data Sender", "app.principalId"),
        ("namespace::ordersQueue", "Service Bus Data Sender", "app.principalId"),
        ("statusQueues[i]", "Service Bus Data Receiver", "app.principalId"),
        # The operator CLI (orderflow/cli) reads and replays the dead letters of every queue, cancels, alerts.
        ("namespace", "Service Bus Data Receiver", "operatorPrincipalId"),
        ("namespace", "Service Bus Data Sender", "operatorPrincipalId"),
        ("scheduler::taskHub", "Durable Task Data Contributor", "appPrincipalId"),
    ]
)


def test_every_role_assignment_matches_the_least_privilege_table() -> None:
    found = Counter()
    for assignment in assignments():
        role = ROLE_NAMES[role_id(assignment)]
        found[(text(assignment.get("scope")), role, text(assignment.get("properties", "principalId")))] += 1
    assert found == EXPECTED


def test_role_assignment_names_are_guid_of_scope_principal_role() -> None:
    for assignment in assignments():
        name = assignment.get("name")
        assert name is not None and text(name.named_children[0]) == "guid", assignment.symbol
        scope_arg, principal_arg, role_arg = (text(a) for a in name.named_children[-1].named_children)
        assert scope_arg == f"{text(assignment.get('scope'))}.id"
        assert principal_arg == text(assignment.get("properties", "principalId"))
        role_call = assignment.get("properties", "roleDefinitionId")
        assert role_arg == text(role_call.named_children[-1].named_children[-1])


def test_conditional_grants_skip_empty_principals() -> None:
    for assignment in assignments():
        principal = text(assignment.get("properties", "principalId"))
        if principal in {"app.principalId", "operatorPrincipalId"}:
            assert assignment.condition is not None and "!empty(" in text(assignment.condition)


def test_managed_identities_are_service_principals() -> None:
    for assignment in assignments():
        if text(assignment.get("properties", "principalId")) in {"appPrincipalId", "agentPrincipalId"}:
            assert evaluate(assignment.get("properties", "principalType"), Scope(assignment.file)) == "ServicePrincipal"


def test_reader_is_granted_on_queues_only_never_wider() -> None:
    # Reader's `*/read` on a queue reads its properties and runtime counts; on the namespace or the resource group it
    # would read every other resource too. No other principal gets it.
    readers = [a for a in assignments() if ROLE_NAMES[role_id(a)] == "Reader"]
    assert {text(a.get("scope")) for a in readers} == {
        "namespace::ordersQueue",
        "namespace::agentRequestsQueue",
        "namespace::agentRepliesQueue",
        "namespace::operatorAlertsQueue",
        "inboundQueues[i]",
        "statusQueues[i]",
    }
    assert {text(a.get("properties", "principalId")) for a in readers} == {"appPrincipalId"}


def test_cosmos_grants_are_data_contributor_for_the_app_per_database() -> None:
    rbac = app("rbac.bicep")
    grants = [
        g
        for g in rbac.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
        if text(g.get("properties", "principalId")) == "appPrincipalId"
    ]
    assert evaluate(rbac.variables["cosmosDataContributor"], Scope(rbac)) == "00000000-0000-0000-0000-000000000002"
    scopes = set()
    for grant in grants:
        assert text(grant.get("properties", "roleDefinitionId")) == (
            "'${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataContributor}'"
        )
        scopes.add(text(grant.get("properties", "scope")))
    assert scopes == {
        "'${cosmosAccount.id}/dbs/${ordersDatabaseName}'",
        "'${cosmosAccount.id}/dbs/${stateDatabaseName}'",
    }
    every_file = [
        r for f in all_files() for r in f.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
    ]
    assert len(every_file) == 6, "the app's two grants, the Agent's circuit-breaker grant, the operators' three"


def test_the_operators_read_the_orders_and_write_the_state_database_only_when_configured() -> None:
    # The operator CLI: `order` reads the order, `order(s)`/`summary` query the state, `resubmit` and `breaker
    # open|close` write it. Cosmos DB Built-in Data Reader and Data Contributor
    # (https://learn.microsoft.com/azure/cosmos-db/nosql/security/reference-data-plane-roles).
    rbac = app("rbac.bicep")
    scope = Scope(rbac)
    found = {
        (text(g.get("properties", "roleDefinitionId")), text(g.get("properties", "scope")))
        for g in rbac.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
        if text(g.get("properties", "principalId")) == "operatorPrincipalId"
        and "!empty(operatorPrincipalId)" in text(g.condition)
    }
    assert evaluate(rbac.variables["cosmosDataReader"], scope) == "00000000-0000-0000-0000-000000000001"
    assert found == {
        (
            "'${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataReader}'",
            "'${cosmosAccount.id}/dbs/${ordersDatabaseName}'",
        ),
        (
            "'${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataContributor}'",
            "'${cosmosAccount.id}/dbs/${stateDatabaseName}'",
        ),
        ("keepOrderRole.id", KEEP_SCOPE),  # `orderflow keep`: the stored order's ttl (docs/retention.md)
    }


# The operators' custom role for `orderflow keep`: a point read and an If-Match replace of a stored order (the
# data-plane actions reference below), on the orders container only.
KEEP_DATA_ACTIONS = {
    "Microsoft.DocumentDB/databaseAccounts/readMetadata",
    "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/read",
    "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/replace",
}
KEEP_SCOPE = "'${cosmosAccount.id}/dbs/${ordersDatabaseName}/colls/${ordersContainerName}'"


def test_the_keep_role_reads_and_replaces_stored_orders_only_when_operators_are_configured() -> None:
    role = _custom_role("keepOrderRole")
    assert "!empty(operatorPrincipalId)" in text(role.condition)
    (permission,) = evaluate(role.get("properties"), Scope(role.file))["permissions"]
    assert set(permission["dataActions"]) == KEEP_DATA_ACTIONS and len(permission["dataActions"]) == 3
    assert [text(s) for s in role.get("properties", "assignableScopes").named_children] == [KEEP_SCOPE]


# ---- the Agent: the circuit-breaker container only (issue 11) ----

# Azure Cosmos DB for NoSQL data plane actions reference
# (https://learn.microsoft.com/azure/cosmos-db/nosql/security/reference-data-plane-actions).
BREAKER_DATA_ACTIONS = {
    "Microsoft.DocumentDB/databaseAccounts/readMetadata",
    "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/read",
    "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/create",
    "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/replace",
}
BREAKER_SCOPE = "'${cosmosAccount.id}/dbs/${stateDatabaseName}/colls/${circuitBreakerContainerName}'"


def _custom_role(symbol: str) -> Resource:
    definitions = [
        r for f in all_files() for r in f.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions")
    ]
    assert [d.symbol for d in definitions] == ["circuitBreakerRole", "keepOrderRole"], "two custom Cosmos roles"
    return next(d for d in definitions if d.symbol == symbol)


def _breaker_role() -> Resource:
    return _custom_role("circuitBreakerRole")


def test_the_breaker_role_allows_exactly_read_create_replace_items_and_metadata() -> None:
    role = _breaker_role()
    properties = evaluate(role.get("properties"), Scope(role.file))
    assert properties["type"] == "CustomRole"
    (permission,) = properties["permissions"]
    assert set(permission) == {"dataActions"}, "Cosmos DB RBAC has no notDataActions: list the allowed ones only"
    actions = permission["dataActions"]
    assert len(actions) == len(set(actions)) and set(actions) == BREAKER_DATA_ACTIONS
    assert not [a for a in actions if "*" in a or re.search(r"delete|upsert|executeQuery|readChangeFeed", a)]
    # Assignable at the container only: the role cannot be granted on the account or a database.
    assert [text(s) for s in role.get("properties", "assignableScopes").named_children] == [BREAKER_SCOPE]


# azure-cosmos ContainerProxy methods -> the data action each one needs (the reference above).
SDK_DATA_ACTIONS = {
    "read_item": "items/read",
    "create_item": "items/create",
    "replace_item": "items/replace",
    "upsert_item": "items/upsert",
    "delete_item": "items/delete",
    "query_items": "executeQuery",  # the reference: an SDK query needs executeQuery and readChangeFeed
    # Not mapped yet: a call of one of these fails the test below until someone checks what it needs.
    "patch_item": "unchecked",
    "read_all_items": "unchecked",
    "query_items_change_feed": "unchecked",
}


def _container_calls(module: ast.Module, class_name: str) -> set[str]:
    """The ContainerProxy methods a class calls, directly or through the module's own (module-level) functions."""
    functions = {n.name: n for n in module.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)}
    (cls,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    found: set[str] = set()
    seen: set[str] = set()
    todo: list[ast.AST] = [cls]
    while todo:
        for node in ast.walk(todo.pop()):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in SDK_DATA_ACTIONS:
                found.add(name)
            elif name in functions and name not in seen:
                seen.add(name)
                todo.append(functions[name])
    return found


def test_the_breaker_data_actions_are_what_the_breaker_store_calls() -> None:
    # The Agent touches Cosmos DB only through orderflow.azure.cosmos.CosmosDocuments (open_breaker_documents):
    # every SDK call it can make must be allowed, and nothing more is allowed than it calls (plus readMetadata).
    # CosmosDocuments is in cosmos.py; the point reads and writes it calls are in _cosmos_io.py.
    adapter = [ast.parse((REPO / "orderflow" / "azure" / f).read_text()) for f in ("cosmos.py", "_cosmos_io.py")]
    calls = _container_calls(ast.Module(body=[n for m in adapter for n in m.body], type_ignores=[]), "CosmosDocuments")
    assert calls, "the scan found no SDK call: has the breaker store moved?"
    allowed = {a.rsplit("/containers/", 1)[1] for a in BREAKER_DATA_ACTIONS if "/containers/" in a}
    assert {SDK_DATA_ACTIONS[c] for c in calls} == allowed, sorted(calls)


def test_the_agents_only_cosmos_grant_is_the_breaker_role_on_the_breaker_container() -> None:
    rbac = app("rbac.bicep")
    grants = [
        g
        for g in rbac.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
        if text(g.get("properties", "principalId")) == "agentPrincipalId"
    ]
    assert [g.symbol for g in grants] == ["agentCircuitBreakerData"]
    (grant,) = grants
    assert text(grant.get("properties", "roleDefinitionId")) == "circuitBreakerRole.id"
    assert text(grant.get("properties", "scope")) == BREAKER_SCOPE
    assert text(grant.get("name").named_children[-1]).startswith("(cosmosAccount.id, agentPrincipalId, ")
    # main.bicep passes the Agent identity and the same database and container names the Cosmos module creates.
    params = main().module("rbac").params()
    assert text(params["agentPrincipalId"]) == "identity.outputs.agentPrincipalId"
    for key in ("stateDatabaseName", "circuitBreakerContainerName"):
        assert text(params[key]) == text(main().module("cosmos").params()[key]) == key
    assert evaluate(main().params["circuitBreakerContainerName"], Scope(main())) == settings.get(
        "CircuitBreakerContainerName", env={}
    )


def test_the_function_app_reaches_the_breaker_container_through_its_state_database_grant() -> None:
    # The container is a child of the state database, on which the app holds Data Contributor (reads for the
    # Starter, writes for the operator command `python -m orderflow.cli.breaker open|close`).
    cosmos = module_scope(Scope(main()), main().module("cosmos"))
    container = cosmos.file.resource("circuitBreakerContainer")
    assert text(container.get("parent")) == "stateDatabase"
    assert evaluate(container.get("name"), cosmos) == settings.get("CircuitBreakerContainerName", env={})
    scopes = {
        text(g.get("properties", "scope"))
        for g in app("rbac.bicep").resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
        if text(g.get("properties", "principalId")) == "appPrincipalId"
    }
    assert "'${cosmosAccount.id}/dbs/${stateDatabaseName}'" in scopes
