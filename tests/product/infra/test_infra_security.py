"""Infra security: identity only. disableLocalAuth on every resource that has it, storage without shared keys,
no listKeys()/account keys/SAS/secret-bearing connection strings anywhere in infra/, and no Data Owner
role.
"""

from __future__ import annotations

import re

import pytest
from support.bicep_tree import INFRA, REPO, Scope, all_files, app, evaluate
from support.infra_rules import FORBIDDEN

# Resource types whose local (key/SAS) authentication can be switched off, and where the switch lives
# (Application Insights spells it DisableLocalAuth: Microsoft.Insights/components@2020-02-02).
LOCAL_AUTH_SWITCH = {
    "Microsoft.ServiceBus/namespaces": ("properties", "disableLocalAuth"),
    "Microsoft.DocumentDB/databaseAccounts": ("properties", "disableLocalAuth"),
    "Microsoft.Insights/components": ("properties", "DisableLocalAuth"),
    "Microsoft.OperationalInsights/workspaces": ("properties", "features", "disableLocalAuth"),
}
SERVICE_BUS_DATA_OWNER = "090c5cfd-751d-490a-894a-3ce6f1109419"
CHECKED_TEXT = [
    *sorted(INFRA.rglob("*.bicep")),
    INFRA / "main.parameters.json",
    REPO / "host.json",
    REPO / "local.settings.sample.json",
    REPO / "local.settings.func.sample.json",
    REPO / "azure.yaml",
]


def _declared_resources():
    return [r for f in all_files() for r in f.resources if not r.existing]


@pytest.mark.parametrize("type_name", sorted(LOCAL_AUTH_SWITCH))
def test_local_auth_is_disabled_on_every_resource_that_has_it(type_name: str) -> None:
    resources = [r for r in _declared_resources() if r.type == type_name]
    assert resources, f"no {type_name} declared"
    for resource in resources:
        value = evaluate(resource.get(*LOCAL_AUTH_SWITCH[type_name]), Scope(resource.file))
        assert value is True, f"{resource.file.name}: {resource.symbol} keeps local auth"


# The one key-shaped text allowed: the Service Bus emulator's connection string with Microsoft's fixed placeholder key
# (overview-emulator: "SharedAccessKey=SAS_KEY_VALUE"), on the loopback address only, in the `func start` sample and
# its comment, which point Core Tools at `python -m devhost servicebus`. Its key name is the emulator's root policy or
# an identity of infra/ (the endpoint's rights: docs/devhost.md, "Rights"). Its removal leaves nothing key-shaped.
EMULATOR_PLACEHOLDER = re.compile(
    r"Endpoint=sb://(?:127\.0\.0\.1|localhost)(?::\d+)?;SharedAccessKeyName=(?:RootManageSharedAccessKey|[a-z][a-z0-9-]*);"
    r"SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;|SharedAccessKey=SAS_KEY_VALUE"
)
PLACEHOLDER_ALLOWED = {REPO / "local.settings.func.sample.json"}


@pytest.mark.parametrize("path", CHECKED_TEXT, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_keys_sas_or_secret_connection_strings(path) -> None:
    source = path.read_text()
    if path in PLACEHOLDER_ALLOWED:
        source = EMULATOR_PLACEHOLDER.sub("", source)
    for pattern in FORBIDDEN:
        assert not re.search(pattern, source, re.IGNORECASE), f"{path.name} contains {pattern}"


def test_the_forbidden_patterns_catch_a_key() -> None:
    leaked = "value: 'Endpoint=sb://x/;SharedAccessKeyName=a;SharedAccessKey=${sb.listKeys().primaryKey}'"
    assert sum(bool(re.search(p, leaked, re.IGNORECASE)) for p in FORBIDDEN) >= 3


def test_the_emulator_allowance_removes_only_the_placeholder_on_loopback() -> None:
    real_key = "Endpoint=sb://ns.servicebus.windows.net;SharedAccessKeyName=a;SharedAccessKey=abc123=;"
    remote = "Endpoint=sb://10.0.0.4;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=abc;"
    for text in (real_key, remote):
        assert any(re.search(p, EMULATOR_PLACEHOLDER.sub("", text), re.IGNORECASE) for p in FORBIDDEN)
    emulator = "Endpoint=sb://127.0.0.1;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    assert not any(re.search(p, EMULATOR_PLACEHOLDER.sub("", emulator), re.IGNORECASE) for p in FORBIDDEN)


def test_storage_is_identity_only() -> None:
    storage = app("storage.bicep").resource("storage")
    properties = evaluate(storage.get("properties"), Scope(storage.file))
    assert properties["allowSharedKeyAccess"] is False
    assert properties["allowBlobPublicAccess"] is False
    assert properties["minimumTlsVersion"] == "TLS1_2"
    assert properties["supportsHttpsTrafficOnly"] is True
    container = app("storage.bicep").resource("deploymentContainer")
    assert evaluate(container.get("properties", "publicAccess"), Scope(container.file)) == "None"


def test_tls_minimums() -> None:
    namespace = app("servicebus.bicep").resource("namespace")
    assert evaluate(namespace.get("properties", "minimumTlsVersion"), Scope(namespace.file)) == "1.2"
    cosmos = app("cosmos.bicep").resource("account")
    assert evaluate(cosmos.get("properties", "minimalTlsVersion"), Scope(cosmos.file)) == "Tls12"
    assert evaluate(cosmos.get("properties", "disableKeyBasedMetadataWriteAccess"), Scope(cosmos.file)) is True


def test_no_data_owner_role_anywhere() -> None:
    for path in INFRA.rglob("*.bicep"):
        assert SERVICE_BUS_DATA_OWNER not in path.read_text(), path


def test_registry_has_no_password_and_apps_no_basic_publishing() -> None:
    registry = app("registry.bicep").resource("registry")
    properties = evaluate(registry.get("properties"), Scope(registry.file))
    assert properties["adminUserEnabled"] is False and properties["anonymousPullEnabled"] is False
    function = app("function.bicep")
    for symbol in ("ftpCredentials", "scmCredentials"):
        policy = function.resource(symbol)
        assert evaluate(policy.get("properties", "allow"), Scope(function)) is False


def test_identities_are_user_assigned() -> None:
    for bicep, symbol in ((app("function.bicep"), "functionApp"), (app("agent.bicep"), "agent")):
        assert evaluate(bicep.resource(symbol).get("identity", "type"), Scope(bicep)) == "UserAssigned"
