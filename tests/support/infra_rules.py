"""Rules the infra tests share: the text no template or settings file may contain (keys, SAS, connection strings),
the built-in Azure roles by GUID, and every role assignment in infra/ with the role it grants."""

from __future__ import annotations

from support.bicep_tree import Resource, Scope, all_files, evaluate, text

FORBIDDEN = [
    r"listKeys\s*\(",
    r"listConnectionStrings\s*\(",
    r"listAccountSas\s*\(",
    r"listServiceSas\s*\(",
    r"listCredentials\s*\(",
    r"AccountKey=",
    r"SharedAccessKey",
    r"SharedAccessSignature",
    r"primaryKey",
    r"secondaryKey",
    r"primaryMasterKey",
    r"AuthorizationRules",
    r"[?&]sig=",
    r"adminUserEnabled:\s*true",
]
ROLE_NAMES = {
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Service Bus Data Receiver",
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Service Bus Data Sender",
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "7f951dda-4ed3-4680-a7ca-43fe172d538d": "AcrPull",
    "0ad04412-c4d5-4796-b79c-f76d14c8d402": "Durable Task Data Contributor",
    # https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/general#reader: `*/read` only.
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": "Reader",
}


def role_id(assignment: Resource) -> str:
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


def assignments() -> list[Resource]:
    return [r for f in all_files() for r in f.resources_of("Microsoft.Authorization/roleAssignments")]
