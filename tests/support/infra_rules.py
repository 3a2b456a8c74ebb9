"""Rules the infra tests share: the text no template or settings file may contain (keys, SAS, connection strings),
the built-in Azure roles by GUID (the rights module's), and every role assignment in infra/ with the role it grants."""

from __future__ import annotations

from orderflow.embedded.rights._grants import BUILT_IN_ROLES
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
# The built-in Azure roles by GUID: the rights module's table (orderflow/embedded/rights/_grants.py), the one source.
ROLE_NAMES = {guid: role.name for guid, role in BUILT_IN_ROLES.items()}


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
