"""Infra RBAC: each role assignment's role, principal and scope, read from the tree, equals the least-
privilege table (rbac.bicep's header); names are guid(scope, principal, role); Cosmos grants are data-plane
sqlRoleAssignments of the built-in Data Contributor for the app only (the Agent never touches Cosmos).
"""

from __future__ import annotations

from collections import Counter

from .bicep_tree import Resource, Scope, all_files, app, evaluate, text

ROLE_NAMES = {
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Service Bus Data Receiver",
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Service Bus Data Sender",
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "7f951dda-4ed3-4680-a7ca-43fe172d538d": "AcrPull",
    "0ad04412-c4d5-4796-b79c-f76d14c8d402": "Durable Task Data Contributor",
}
# (scope symbol, role, principal expression) for every Azure RBAC assignment in infra/.
EXPECTED = Counter(
    [
        ("namespace::ordersQueue", "Service Bus Data Receiver", "appPrincipalId"),
        ("namespace::agentRequestsQueue", "Service Bus Data Sender", "appPrincipalId"),
        ("namespace::agentRepliesQueue", "Service Bus Data Receiver", "appPrincipalId"),
        ("namespace::operatorAlertsQueue", "Service Bus Data Sender", "appPrincipalId"),
        ("statusQueues[i]", "Service Bus Data Sender", "appPrincipalId"),
        ("storage", "Storage Blob Data Owner", "appPrincipalId"),
        ("storage", "Storage Queue Data Contributor", "appPrincipalId"),
        ("storage", "Storage Table Data Contributor", "appPrincipalId"),
        ("applicationInsights", "Monitoring Metrics Publisher", "appPrincipalId"),
        ("namespace::agentRequestsQueue", "Service Bus Data Receiver", "agentPrincipalId"),
        ("namespace::agentRepliesQueue", "Service Bus Data Sender", "agentPrincipalId"),
        ("namespace::operatorAlertsQueue", "Service Bus Data Sender", "agentPrincipalId"),
        ("registry", "AcrPull", "agentPrincipalId"),
        ("applicationInsights", "Monitoring Metrics Publisher", "agentPrincipalId"),
        ("namespace::ordersQueue", "Service Bus Data Sender", "app.principalId"),
        ("statusQueues[i]", "Service Bus Data Receiver", "app.principalId"),
        ("namespace::operatorAlertsQueue", "Service Bus Data Receiver", "operatorPrincipalId"),
        ("scheduler::taskHub", "Durable Task Data Contributor", "appPrincipalId"),
    ]
)


def _role_id(assignment: Resource) -> str:
    """The GUID behind roleDefinitionId: subscriptionResourceId('...roleDefinitions', <var or roles.x>)."""
    call = assignment.get("properties", "roleDefinitionId")
    assert call is not None and call.type == "call_expression", assignment.symbol
    assert text(call.named_children[0]) == "subscriptionResourceId"
    argument = call.named_children[-1].named_children[-1]
    scope = Scope(assignment.file)
    if argument.type == "member_expression":  # roles.serviceBusDataSender
        table = evaluate(assignment.file.variables[text(argument.named_children[0])], scope)
        return table[text(argument.named_children[-1])]
    return evaluate(argument, scope)


def _assignments() -> list[Resource]:
    return [r for f in all_files() for r in f.resources_of("Microsoft.Authorization/roleAssignments")]


def test_every_role_assignment_matches_the_least_privilege_table() -> None:
    found = Counter()
    for assignment in _assignments():
        role = ROLE_NAMES[_role_id(assignment)]
        found[(text(assignment.get("scope")), role, text(assignment.get("properties", "principalId")))] += 1
    assert found == EXPECTED


def test_role_assignment_names_are_guid_of_scope_principal_role() -> None:
    for assignment in _assignments():
        name = assignment.get("name")
        assert name is not None and text(name.named_children[0]) == "guid", assignment.symbol
        scope_arg, principal_arg, role_arg = (text(a) for a in name.named_children[-1].named_children)
        assert scope_arg == f"{text(assignment.get('scope'))}.id"
        assert principal_arg == text(assignment.get("properties", "principalId"))
        role_call = assignment.get("properties", "roleDefinitionId")
        assert role_arg == text(role_call.named_children[-1].named_children[-1])


def test_conditional_grants_skip_empty_principals() -> None:
    for assignment in _assignments():
        principal = text(assignment.get("properties", "principalId"))
        if principal in {"app.principalId", "operatorPrincipalId"}:
            assert assignment.condition is not None and "!empty(" in text(assignment.condition)


def test_managed_identities_are_service_principals() -> None:
    for assignment in _assignments():
        if text(assignment.get("properties", "principalId")) in {"appPrincipalId", "agentPrincipalId"}:
            assert (
                evaluate(assignment.get("properties", "principalType"), Scope(assignment.file))
                == "ServicePrincipal"
            )


def test_cosmos_grants_are_data_contributor_for_the_app_only_per_database() -> None:
    rbac = app("rbac.bicep")
    grants = rbac.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
    assert (
        evaluate(rbac.variables["cosmosDataContributor"], Scope(rbac))
        == "00000000-0000-0000-0000-000000000002"
    )
    scopes = set()
    for grant in grants:
        assert text(grant.get("properties", "principalId")) == "appPrincipalId"
        assert text(grant.get("properties", "roleDefinitionId")) == (
            "'${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataContributor}'"
        )
        scopes.add(text(grant.get("properties", "scope")))
    assert scopes == {
        "'${cosmosAccount.id}/dbs/${ordersDatabaseName}'",
        "'${cosmosAccount.id}/dbs/${stateDatabaseName}'",
    }
    every_file = [
        r
        for f in all_files()
        for r in f.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
    ]
    assert len(every_file) == 2, "no other Cosmos grant (the Agent has none)"
