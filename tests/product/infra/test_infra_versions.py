"""Infra deployment fixes (issue 9, item 1) and the API versions they rest on, read from the tree:

- no parameter file fixes a principal type: azd fills AZURE_PRINCIPAL_TYPE (User or ServicePrincipal), and an
  empty one falls back to an allowed default;
- every Microsoft.* resource uses an API version a person checked against Azure's published resource types
  (Azure/bicep-types-az), and for the types in VERIFIED_PROPERTIES every property the Bicep sets exists there;
- the Cosmos DB sqlRoleAssignments on one account are serialised (concurrent writes fail with 412);
- the storage queue and table roles exist only with the Azure Storage Durable backend;
- the Docker ignore file of each image azd builds keeps local environments, caches and azd env files out;
- the array parameters have user-defined types.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.bicep_tree import (
    INFRA,
    REPO,
    Resource,
    all_files,
    app,
    azd_parameters,
    azure_yaml_services,
    code_children,
    decorators,
    depends_on,
    main,
    object_items,
    param_type,
    property_paths,
    resolve_type,
    string_value,
    text,
)

# ---------------------------------------------------------------- API versions

# Each entry was checked by hand in Azure/bicep-types-az (commit 1f896de, 2026-08-20): the named types.json holds a
# ResourceType whose name is exactly "<type>@<version>". Adding a version here means doing the same check, and, for
# a type in VERIFIED_PROPERTIES, checking every property the Bicep sets against that version's type definition.
_BT = "Azure/bicep-types-az generated/"
API_VERSIONS: dict[str, str] = {
    "Microsoft.App/containerApps@2025-01-01": _BT + "app_0/microsoft.app/2025-01-01/types.json",
    "Microsoft.App/managedEnvironments@2025-01-01": _BT + "app_0/microsoft.app/2025-01-01/types.json",
    "Microsoft.Authorization/roleAssignments@2022-04-01": _BT
    + "authorization/microsoft.authorization/2022-04-01/types.json",
    # 2023-07-01: rbac.bicep's `existing` reference only (no property set); it has no anonymousPullEnabled.
    "Microsoft.ContainerRegistry/registries@2023-07-01": _BT
    + "containerregistry_0/microsoft.containerregistry/2023-07-01/types.json",
    # 2025-04-01: the first GA version with properties.anonymousPullEnabled (previews since 2023-01-01-preview).
    "Microsoft.ContainerRegistry/registries@2025-04-01": _BT
    + "containerregistry_0/microsoft.containerregistry/2025-04-01/types.json",
    "Microsoft.DocumentDB/databaseAccounts@2024-05-15": _BT + "cosmos-db/microsoft.documentdb/2024-05-15/types.json",
    "Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-05-15": _BT
    + "cosmos-db/microsoft.documentdb/2024-05-15/types.json",
    "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-05-15": _BT
    + "cosmos-db/microsoft.documentdb/2024-05-15/types.json",
    "Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15": _BT
    + "cosmos-db/microsoft.documentdb/2024-05-15/types.json",
    # Issue 11 (the Agent's circuit-breaker role), checked at commit 00e6e94 of the same generated directory (types.md:
    # "Resource Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions@2024-05-15", body SqlRoleDefinitionResource).
    "Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions@2024-05-15": _BT
    + "cosmos-db/microsoft.documentdb/2024-05-15/types.json",
    "Microsoft.DurableTask/schedulers@2025-11-01": _BT + "durabletask_0/microsoft.durabletask/2025-11-01/types.json",
    "Microsoft.DurableTask/schedulers/taskHubs@2025-11-01": _BT
    + "durabletask_0/microsoft.durabletask/2025-11-01/types.json",
    # Issue 26 (the scheduler's retention policy), checked at commit 64446c8 in generated/durabletask/
    # microsoft.durabletask/2025-11-01/types.md: "Resource
    # Microsoft.DurableTask/schedulers/retentionPolicies@2025-11-01", name 'default',
    # RetentionPolicyProperties.retentionPolicies: RetentionPolicyDetails[] (orchestrationState?,
    # retentionPeriodInDays).
    "Microsoft.DurableTask/schedulers/retentionPolicies@2025-11-01": _BT
    + "durabletask/microsoft.durabletask/2025-11-01/types.json",
    "Microsoft.Insights/actionGroups@2023-01-01": _BT + "monitor_1/microsoft.insights/2023-01-01/types.json",
    "Microsoft.Insights/components@2020-02-02": _BT + "applicationinsights/microsoft.insights/2020-02-02/types.json",
    "Microsoft.Insights/diagnosticSettings@2021-05-01-preview": _BT
    + "monitor_1/microsoft.insights/2021-05-01-preview/types.json",
    "Microsoft.Insights/metricAlerts@2018-03-01": _BT + "monitor_1/microsoft.insights/2018-03-01/types.json",
    # Issue 14 (the operations workbook): "Resource Microsoft.Insights/workbooks@2023-06-01" in types.md.
    "Microsoft.Insights/workbooks@2023-06-01": _BT + "applicationinsights/microsoft.insights/2023-06-01/types.json",
    "Microsoft.Insights/scheduledQueryRules@2023-03-15-preview": _BT
    + "monitor_1/microsoft.insights/2023-03-15-preview/types.json",
    "Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31": _BT
    + "msi/microsoft.managedidentity/2023-01-31/types.json",
    "Microsoft.Network/privateDnsZones@2024-06-01": _BT + "privatedns/microsoft.network/2024-06-01/types.json",
    "Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01": _BT
    + "privatedns/microsoft.network/2024-06-01/types.json",
    "Microsoft.Network/privateEndpoints@2024-05-01": _BT + "network/microsoft.network/2024-05-01/types.json",
    "Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01": _BT
    + "network/microsoft.network/2024-05-01/types.json",
    "Microsoft.Network/virtualNetworks@2024-05-01": _BT + "network/microsoft.network/2024-05-01/types.json",
    "Microsoft.Network/virtualNetworks/subnets@2024-05-01": _BT + "network/microsoft.network/2024-05-01/types.json",
    "Microsoft.OperationalInsights/workspaces@2023-09-01": _BT
    + "operationalinsights/microsoft.operationalinsights/2023-09-01/types.json",
    "Microsoft.Resources/resourceGroups@2024-03-01": _BT + "resources_11/microsoft.resources/2024-03-01/types.json",
    "Microsoft.ServiceBus/namespaces@2024-01-01": _BT + "servicebus/microsoft.servicebus/2024-01-01/types.json",
    "Microsoft.ServiceBus/namespaces/queues@2024-01-01": _BT + "servicebus/microsoft.servicebus/2024-01-01/types.json",
    "Microsoft.Storage/storageAccounts@2023-05-01": _BT + "storage/microsoft.storage/2023-05-01/types.json",
    "Microsoft.Storage/storageAccounts/blobServices@2023-05-01": _BT
    + "storage/microsoft.storage/2023-05-01/types.json",
    "Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01": _BT
    + "storage/microsoft.storage/2023-05-01/types.json",
    "Microsoft.Web/serverfarms@2024-04-01": _BT + "web/microsoft.web/2024-04-01/types.json",
    "Microsoft.Web/sites@2024-04-01": _BT + "web/microsoft.web/2024-04-01/types.json",
    "Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01": _BT
    + "web/microsoft.web/2024-04-01/types.json",
    "Microsoft.Web/sites/config@2024-04-01": _BT + "web/microsoft.web/2024-04-01/types.json",
}

# Property paths ('/'-joined, as property_paths() reports them) checked to exist in the body type of
# "<type>@<version>" in the types.json above: the resource's ObjectType, followed through each property's type
# (array item types included; a discriminator key such as sites/config's name counts). For these types every path
# the Bicep sets must be listed: a new property means checking it against that version, then adding it here.
# A listed path need not be set (e.g. the VNet properties of sites, checked ahead for the private posture).
_COMMON = {"name", "location", "tags"}
VERIFIED_PROPERTIES: dict[str, set[str]] = {
    # No properties/anonymousPullEnabled in 2023-07-01 (checked: absent from RegistryProperties).
    "Microsoft.ContainerRegistry/registries@2023-07-01": _COMMON
    | {"sku", "sku/name", "properties", "properties/adminUserEnabled", "properties/publicNetworkAccess"},
    "Microsoft.ContainerRegistry/registries@2025-04-01": _COMMON
    | {
        "sku",
        "sku/name",
        "properties",
        "properties/adminUserEnabled",
        "properties/anonymousPullEnabled",
        "properties/publicNetworkAccess",
        "properties/networkRuleBypassOptions",
        "properties/networkRuleSet",
        "properties/networkRuleSet/defaultAction",
    },
    "Microsoft.Authorization/roleAssignments@2022-04-01": {
        "name",
        "properties",
        "properties/roleDefinitionId",
        "properties/principalId",
        "properties/principalType",
    },
    "Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15": {
        "name",
        "properties",
        "properties/roleDefinitionId",
        "properties/principalId",
        "properties/scope",
    },
    # SqlRoleDefinitionResource: assignableScopes (string[]), permissions (Permission[]: dataActions, notDataActions),
    # roleName, type ('BuiltInRole' | 'CustomRole').
    "Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions@2024-05-15": {
        "name",
        "properties",
        "properties/roleName",
        "properties/type",
        "properties/assignableScopes",
        "properties/permissions",
        "properties/permissions/dataActions",
    },
    # Issue 26 (continuous backup): DatabaseAccountCreateUpdateProperties, Location, ConsistencyPolicy and the
    # BackupPolicy variant ContinuousModeBackupPolicy (type 'Continuous', continuousModeProperties:
    # ContinuousModeProperties { tier 'Continuous30Days' | 'Continuous7Days' }), checked in the same directory's
    # types.md at commit 00e6e94.
    "Microsoft.DocumentDB/databaseAccounts@2024-05-15": _COMMON
    | {
        "kind",
        "properties",
        "properties/databaseAccountOfferType",
        "properties/disableLocalAuth",
        "properties/disableKeyBasedMetadataWriteAccess",
        "properties/minimalTlsVersion",
        "properties/publicNetworkAccess",
        "properties/consistencyPolicy",
        "properties/consistencyPolicy/defaultConsistencyLevel",
        "properties/locations",
        "properties/locations/locationName",
        "properties/locations/failoverPriority",
        "properties/locations/isZoneRedundant",
        "properties/capabilities",
        "properties/capabilities/name",
        "properties/backupPolicy",
        "properties/backupPolicy/type",
        "properties/backupPolicy/continuousModeProperties",
        "properties/backupPolicy/continuousModeProperties/tier",
    },
    # Issue 26: RetentionPolicyProperties.retentionPolicies: RetentionPolicyDetails[] { orchestrationState?,
    # retentionPeriodInDays (required) }; name is the literal 'default'.
    "Microsoft.DurableTask/schedulers/retentionPolicies@2025-11-01": {
        "name",
        "properties",
        "properties/retentionPolicies",
        "properties/retentionPolicies/orchestrationState",
        "properties/retentionPolicies/retentionPeriodInDays",
    },
    "Microsoft.Web/serverfarms@2024-04-01": _COMMON
    | {"kind", "sku", "sku/name", "sku/tier", "properties", "properties/reserved"},
    "Microsoft.Web/sites@2024-04-01": _COMMON
    | {
        "kind",
        "identity",
        "identity/type",
        "identity/userAssignedIdentities",
        "properties",
        "properties/serverFarmId",
        "properties/httpsOnly",
        "properties/siteConfig",
        "properties/siteConfig/minTlsVersion",
        "properties/siteConfig/ftpsState",
        # Issue 25, the private posture's inbound side (SiteConfig: 'Allow' | 'Deny' | string, and a bool).
        "properties/siteConfig/ipSecurityRestrictionsDefaultAction",
        "properties/siteConfig/scmIpSecurityRestrictionsUseMain",
        "properties/siteConfig/scmIpSecurityRestrictionsDefaultAction",
        "properties/siteConfig/vnetRouteAllEnabled",
        "properties/siteConfig/publicNetworkAccess",
        "properties/virtualNetworkSubnetId",
        "properties/vnetRouteAllEnabled",
        "properties/vnetContentShareEnabled",
        "properties/publicNetworkAccess",
        "properties/functionAppConfig",
        "properties/functionAppConfig/deployment",
        "properties/functionAppConfig/deployment/storage",
        "properties/functionAppConfig/deployment/storage/type",
        "properties/functionAppConfig/deployment/storage/value",
        "properties/functionAppConfig/deployment/storage/authentication",
        "properties/functionAppConfig/deployment/storage/authentication/type",
        "properties/functionAppConfig/deployment/storage/authentication/userAssignedIdentityResourceId",
        "properties/functionAppConfig/runtime",
        "properties/functionAppConfig/runtime/name",
        "properties/functionAppConfig/runtime/version",
        "properties/functionAppConfig/scaleAndConcurrency",
        "properties/functionAppConfig/scaleAndConcurrency/alwaysReady",
        "properties/functionAppConfig/scaleAndConcurrency/instanceMemoryMB",
        "properties/functionAppConfig/scaleAndConcurrency/maximumInstanceCount",
    },
    # appsettings: the app settings dictionary (union(...)), not checked further. authsettingsV2 (issue 25, operator
    # sign-in): the body SiteAuthSettingsV2Properties of the config resource named 'authsettingsV2' (types.md of the
    # same directory: AuthPlatform, GlobalValidation, HttpSettings, IdentityProviders, AzureActiveDirectory,
    # AzureActiveDirectoryRegistration, AzureActiveDirectoryValidation, Login, TokenStore).
    "Microsoft.Web/sites/config@2024-04-01": {
        "name",
        "properties",
        "properties/platform",
        "properties/platform/enabled",
        "properties/globalValidation",
        "properties/globalValidation/requireAuthentication",
        "properties/globalValidation/unauthenticatedClientAction",
        "properties/globalValidation/excludedPaths",
        "properties/httpSettings",
        "properties/httpSettings/requireHttps",
        "properties/identityProviders",
        "properties/identityProviders/azureActiveDirectory",
        "properties/identityProviders/azureActiveDirectory/enabled",
        "properties/identityProviders/azureActiveDirectory/registration",
        "properties/identityProviders/azureActiveDirectory/registration/clientId",
        "properties/identityProviders/azureActiveDirectory/registration/openIdIssuer",
        "properties/identityProviders/azureActiveDirectory/validation",
        "properties/identityProviders/azureActiveDirectory/validation/allowedAudiences",
        "properties/identityProviders/azureActiveDirectory/validation/defaultAuthorizationPolicy",
        "properties/identityProviders/azureActiveDirectory/validation/jwtClaimChecks",
        "properties/login",
        "properties/login/tokenStore",
        "properties/login/tokenStore/enabled",
    },
    "Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01": {"name", "properties", "properties/allow"},
}


def _microsoft_resources() -> list[Resource]:
    return [r for f in all_files() for r in f.resources if r.type.lower().startswith("microsoft.")]


def test_the_verified_lists_are_consistent() -> None:
    assert set(VERIFIED_PROPERTIES) <= set(API_VERSIONS)
    for key, source in API_VERSIONS.items():
        namespace, version = key.split("/")[0].lower(), key.rsplit("@", 1)[1]
        assert source.endswith(f"/{namespace}/{version}/types.json"), key


def test_every_microsoft_resource_uses_a_verified_api_version() -> None:
    unverified = sorted(
        f"{r.file.name}: {r.symbol} {r.type}@{r.api_version}"
        for r in _microsoft_resources()
        if f"{r.type}@{r.api_version}" not in API_VERSIONS
    )
    assert unverified == [], "check these against Azure/bicep-types-az, then add them to API_VERSIONS"


def test_every_property_set_exists_in_its_api_version() -> None:
    unverified = []
    for resource in _microsoft_resources():
        key = f"{resource.type}@{resource.api_version}"
        if resource.existing or not any(k.split("@")[0] == resource.type for k in VERIFIED_PROPERTIES):
            continue
        allowed = VERIFIED_PROPERTIES.get(key)
        if allowed is None:
            unverified.append(f"{resource.file.name}: {resource.symbol}: {key} has no verified property list")
            continue
        unverified += [
            f"{resource.file.name}: {resource.symbol}: {path} not verified in {key}"
            for path in sorted(property_paths(resource) - allowed)
        ]
    assert unverified == []


def test_the_registry_sets_anonymous_pull_on_a_version_that_has_it() -> None:
    (registry,) = app("registry.bicep").resources_of("Microsoft.ContainerRegistry/registries")
    if "properties/anonymousPullEnabled" in property_paths(registry):
        assert "properties/anonymousPullEnabled" in VERIFIED_PROPERTIES[f"{registry.type}@{registry.api_version}"]


# ---------------------------------------------------------------- (a) principal types come from azd

# `${VAR}`, or `${VAR=Default}` with a literal default for an azd too old to fill VAR (or a lookup that fails).
AZD_REFERENCE = re.compile(r"^\$\{[A-Z][A-Z0-9_]*(=[A-Za-z]+)?\}$")


def _principal_types(value: object, where: str) -> list[tuple[str, object]]:
    """(path, value) of every `principalType`-like key in a parameters document."""
    found: list[tuple[str, object]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}"
            if key.lower().endswith("principaltype"):
                found.append((path, item.get("value") if isinstance(item, dict) and "value" in item else item))
            else:
                found += _principal_types(item, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _principal_types(item, f"{where}[{i}]")
    return found


PARAMETER_FILES = sorted(INFRA.glob("*.parameters.json"))


@pytest.mark.parametrize("path", PARAMETER_FILES, ids=lambda p: p.name)
def test_no_parameter_file_fixes_a_principal_type(path: Path) -> None:
    document = json.loads(path.read_text())
    for where, value in _principal_types(document, path.name):
        assert isinstance(value, str) and AZD_REFERENCE.match(value), f"{where} = {value!r}: use an azd variable"


def test_the_deployers_principal_type_is_azds() -> None:
    apps = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]["submittingApps"]["value"]
    with_azd_principal = [a for a in apps if a.get("principalId") == "${AZURE_PRINCIPAL_ID}"]
    assert with_azd_principal, "the deploying principal is a submitting application"
    for entry in with_azd_principal:
        assert entry.get("principalType", "").startswith("${AZURE_PRINCIPAL_TYPE")
    # ...and the parameter's type accepts both values azd writes (User when a user, ServicePrincipal in CI).
    union = _property_type(main(), param_type(main(), "submittingApps").removesuffix("[]"), "principalType")
    assert {"User", "ServicePrincipal"} <= _string_literals(union)


@pytest.mark.parametrize("azd_type", ["User", "ServicePrincipal", ""], ids=["user", "service-principal", "empty"])
def test_the_principal_type_azd_passes_is_one_the_type_allows(azd_type: str) -> None:
    # Empty: azd before 1.17.1 (the first to fill AZURE_PRINCIPAL_TYPE, azure-dev CHANGELOG #5285) or a failed lookup;
    # an empty string fails the type's allowed values, so the parameters file gives a default.
    allowed = _string_literals(
        _property_type(main(), param_type(main(), "submittingApps").removesuffix("[]"), "principalType")
    )
    (entry,) = [a for a in azd_parameters({"AZURE_PRINCIPAL_TYPE": azd_type})["submittingApps"] if a["name"] == "app"]
    assert entry["principalType"] in allowed
    assert entry["principalType"] == (azd_type or "User")


# ---------------------------------------------------------------- (c) Cosmos role assignments are serialised

# The account's data-plane RBAC writes: role assignments and (issue 11) the custom role definition they may use.
COSMOS_RBAC_TYPES = (
    "Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions",
    "Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments",
)


def _cosmos_rbac_writes(bicep) -> list[Resource]:
    """Role definitions and assignments of the file, in declaration order."""
    return sorted(
        (r for t in COSMOS_RBAC_TYPES for r in bicep.resources_of(t) if not r.existing), key=lambda r: r.body.start_byte
    )


def test_cosmos_role_assignments_on_one_account_are_serialised() -> None:
    files = {f.name for f in all_files() if _cosmos_rbac_writes(f)}
    assert len(files) <= 1, f"Cosmos RBAC writes in several modules can run concurrently: {sorted(files)}"
    for bicep in all_files():
        by_account: dict[str, list[Resource]] = {}
        for grant in _cosmos_rbac_writes(bicep):
            account = grant.parent.symbol if grant.parent is not None else text(grant.get("parent"))
            by_account.setdefault(account, []).append(grant)
            if grant.loop:
                assert "@batchSize(1)" in decorators(grant), f"{grant.symbol}: a loop of grants needs @batchSize(1)"
        for account, grants in by_account.items():
            for previous, grant in zip(grants, grants[1:], strict=False):
                assert previous.symbol in _transitive_depends_on(grant), (
                    f"{bicep.name}: {grant.symbol} must dependsOn {previous.symbol} (one write at a time on {account})"
                )


def _references(resource: Resource) -> set[str]:
    """The file's resource symbols a resource's body names (`x.id`, ...): Bicep's implicit dependencies."""
    symbols = {r.symbol for r in resource.file.resources} - {resource.symbol}
    found: set[str] = set()
    stack = [resource.body]
    while stack:
        node = stack.pop()
        is_key = node.parent is not None and node.parent.type == "object_property" and node.prev_sibling is None
        if node.type == "identifier" and text(node) in symbols and not is_key:
            found.add(text(node))
        stack.extend(node.named_children)
    return found


def _direct_dependencies(resource: Resource) -> set[str]:
    # `parent: cosmosAccount` (an existing resource) is a reference too, harmless: it writes nothing.
    return depends_on(resource) | _references(resource)


def _transitive_depends_on(resource: Resource) -> set[str]:
    seen: set[str] = set()
    todo = list(_direct_dependencies(resource))
    while todo:
        symbol = todo.pop()
        if symbol not in seen:
            seen.add(symbol)
            todo += [d for r in resource.file.resources if r.symbol == symbol for d in _direct_dependencies(r)]
    return seen


def test_an_implicit_dependency_counts_and_a_missing_one_is_caught() -> None:
    rbac = app("rbac.bicep")
    writes = [r.symbol for r in _cosmos_rbac_writes(rbac)]
    assert writes == [
        "appOrdersData",
        "appStateData",
        "circuitBreakerRole",
        "agentCircuitBreakerData",
        "operatorsReadOrders",
        "operatorsStateData",
        "keepOrderRole",
        "operatorsKeepOrders",
    ]
    # The assignment names the definition's id (implicit); the definition lists appStateData (explicit).
    assert "circuitBreakerRole" in _references(rbac.resource("agentCircuitBreakerData"))
    assert {"circuitBreakerRole", "appStateData", "appOrdersData"} <= _transitive_depends_on(
        rbac.resource("agentCircuitBreakerData")
    )
    assert "agentCircuitBreakerData" not in _transitive_depends_on(rbac.resource("circuitBreakerRole"))


# ---------------------------------------------------------------- (d) storage roles per Durable backend

STORAGE_QUEUE_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
STORAGE_TABLE_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
STORAGE_BLOB_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
AZURE_STORAGE_ONLY = {"durableBackend == 'AzureStorage'", "durableBackend != 'DurableTaskScheduler'"}


def _role_guid(assignment: Resource) -> str:
    roles = {k: string_value(v) for k, v in object_items(assignment.file.variables["roles"])}
    role = text(assignment.get("properties", "roleDefinitionId"))
    return next((guid for name, guid in roles.items() if f"roles.{name})" in role), role)


def _condition_source(resource: Resource) -> str:
    """The condition's text, with a variable replaced by its definition."""
    if resource.condition is None:
        return ""
    condition = text(resource.condition).strip("() ")
    if condition in resource.file.variables:
        condition = text(resource.file.variables[condition])
    return " ".join(condition.split())


def test_storage_queue_and_table_roles_only_with_the_azure_storage_backend() -> None:
    rbac = app("rbac.bicep")
    by_role: dict[str, list[Resource]] = {}
    for assignment in rbac.resources_of("Microsoft.Authorization/roleAssignments"):
        by_role.setdefault(_role_guid(assignment), []).append(assignment)
    for role in (STORAGE_QUEUE_CONTRIBUTOR, STORAGE_TABLE_CONTRIBUTOR):
        assert by_role.get(role), role
        for assignment in by_role[role]:
            assert _condition_source(assignment) in AZURE_STORAGE_ONLY, assignment.symbol
    # Blob Data Owner stays unconditional: AzureWebJobsStorage and the Flex deployment container need it.
    assert [a.condition for a in by_role[STORAGE_BLOB_OWNER]] == [None]
    # ...and main.bicep passes the chosen backend (the module's default would grant them always).
    assert text(main().module("rbac").params()["durableBackend"]) == "durableBackend"


# ---------------------------------------------------------------- (e) the Agent image's Docker ignore file

MUST_EXCLUDE = [
    ".venv/bin/python",
    ".venv-worker/lib/x.py",
    "node_modules/x/package.json",
    ".azure/dev/.env",
    ".git/config",
    ".devhost/state.json",
    ".demo/run.json",
    ".pytest_cache/v/cache",
    ".hypothesis/examples/x",
    ".mypy_cache/3.11/x.json",
    ".ruff_cache/x",
    "local.settings.json",
    "orderflow/__pycache__/settings.cpython-311.pyc",
]
MUST_KEEP = ["requirements.txt", "orderflow/settings.py", "agent/__main__.py"]
# Per image: what it COPYs beyond MUST_KEEP, and what it must leave out.
IMAGE_KEEPS = {"agent": [], "simulator": ["lab/simulator.py", "lab/simulator_ledger.py"]}
IMAGE_EXCLUDES = {"agent": ["lab/simulator.py", "lab/drill.py"], "simulator": []}
DOCKER_SERVICES = sorted(name for name, service in azure_yaml_services().items() if "docker/path" in service)


def _docker(service: str) -> tuple[Path, Path]:
    """(Dockerfile, context) of an azure.yaml service."""
    settings = azure_yaml_services()[service]
    return REPO / settings["docker/path"], REPO / settings["docker/context"]


def _ignore_file(service: str) -> Path | None:
    # azd (cli/azd/pkg/containerregistry/pack_source.go) and BuildKit: "<Dockerfile>.dockerignore", else
    # "<context>/.dockerignore".
    dockerfile, context = _docker(service)
    for candidate in (Path(f"{dockerfile}.dockerignore"), context / ".dockerignore"):
        if candidate.is_file():
            return candidate
    return None


def _pattern(pattern: str) -> re.Pattern[str]:
    # moby/patternmatcher: '**' any path, '*' and '?' within one element; a pattern is cleaned (no trailing '/').
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "$")


def _ignored(path: str, lines: list[str]) -> bool:
    """moby/patternmatcher MatchesOrParentMatches: the last matching pattern wins, '!' re-includes."""
    rules = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rules.append((negate, _pattern(line.lstrip("!").strip().strip("/"))))
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for negate, regex in rules:
        if any(regex.match(c) for c in candidates):
            ignored = not negate
    return ignored


def test_the_matcher_follows_dockerignore_rules() -> None:
    assert _ignored(".venv/bin/python", [".venv/"])
    assert not _ignored("src/.venv/x", [".venv/"])
    assert _ignored("a/b/__pycache__/x.pyc", ["**/__pycache__/"])
    assert not _ignored(".venv/x", [".venv/", "!.venv"])


def test_every_image_azd_builds() -> None:
    assert DOCKER_SERVICES == ["agent", "simulator"]


@pytest.mark.parametrize("service", DOCKER_SERVICES)
def test_each_image_ignores_local_environments_and_caches(service: str) -> None:
    ignore = _ignore_file(service)
    assert ignore is not None, f"add {_docker(service)[0].relative_to(REPO)}.dockerignore (or a root .dockerignore)"
    lines = ignore.read_text().splitlines()
    assert [p for p in MUST_EXCLUDE if not _ignored(p, lines)] == []
    assert [p for p in MUST_KEEP + IMAGE_KEEPS[service] if _ignored(p, lines)] == [], "the Dockerfile COPYs these"
    assert [p for p in IMAGE_EXCLUDES[service] if not _ignored(p, lines)] == [], "the image must not hold these"
    copied = re.findall(r"^COPY\s+(.+?)\s+\S+$", _docker(service)[0].read_text(), re.M)
    for source in " ".join(copied).split():
        assert not _ignored(source.rstrip("/"), lines), source


# ---------------------------------------------------------------- (f) the array parameters have types


def _property_type(bicep, type_name: str, prop: str):
    declared = resolve_type(bicep, type_name)
    assert declared is not None and declared.type == "object", f"{bicep.name}: no object type {type_name!r}"
    for node in declared.named_children:
        if node.type == "object_property":
            key, value = code_children(node)[0], code_children(node)[-1]
            if text(key) == prop:
                return value
    raise AssertionError(f"{type_name} has no property {prop!r}")


def _string_literals(node) -> set[str]:
    found = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type == "string" and string_value(current) is not None:
            found.add(string_value(current))
        stack.extend(current.named_children)
    return found


# (file, parameter, {property: expected type text}) for every array parameter that carries entries.
TYPED_ARRAYS = [
    ("main.bicep", "submittingApps", {"name": "string", "principalId": "string"}),
    ("main.bicep", "functionAlwaysReady", {"name": "string", "instanceCount": "int"}),
    ("app/rbac.bicep", "submittingApps", {"name": "string", "principalId": "string"}),
    ("app/function.bicep", "alwaysReady", {"name": "string", "instanceCount": "int"}),
]


@pytest.mark.parametrize(("file", "param", "properties"), TYPED_ARRAYS, ids=lambda v: v if isinstance(v, str) else "")
def test_array_parameters_have_user_defined_types(file: str, param: str, properties: dict[str, str]) -> None:
    bicep = next(f for f in all_files() if f.name == file)
    declared = param_type(bicep, param)
    assert declared.endswith("[]") and declared != "array", f"{file}: {param} is {declared!r}"
    for prop, expected in properties.items():
        assert text(_property_type(bicep, declared.removesuffix("[]"), prop)) == expected, (file, param, prop)


def test_every_module_receiving_a_typed_array_declares_the_type() -> None:
    typed = {"submittingApps", "functionAlwaysReady"}
    for module in main().modules:
        target = module.target()
        for key, value in module.params().items():
            if text(value) in typed and target is not None:
                assert param_type(target, key) != "array", f"{target.name}: {key} is an untyped array"
