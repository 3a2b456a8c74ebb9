"""The private posture (main.bicep vnetEnabled, azd env VNET_ENABLED): with it on, every data service has public
network access Disabled and a private endpoint for each of its private-link groups, Service Bus is Premium, the
function app and the Agent's Container Apps environment join their subnets, and the function app's own inbound side is
private too (no public request reaches its HTTP routes; a private endpoint serves the VNet); with it off, nothing is
deployed for it and every property falls back to the public posture. The Durable Task Scheduler is the documented
exception.
"""

from __future__ import annotations

import json

import pytest
from support.bicep_tree import (
    INFRA,
    REPO,
    Module,
    Scope,
    app,
    code_children,
    evaluate,
    main,
    module_scope,
    object_get,
    text,
    with_params,
)

# Data service -> (main.bicep module, resource symbol in it, resource type, {private-link group: privatelink zone}).
# Groups and zones: the private-link sub-resources and the public cloud's privatelink zones of each service.
DATA_SERVICES = {
    "storage": (
        "storage",
        "storage",
        "Microsoft.Storage/storageAccounts",
        {
            "blob": "privatelink.blob.${environment().suffixes.storage}",
            "queue": "privatelink.queue.${environment().suffixes.storage}",
            "table": "privatelink.table.${environment().suffixes.storage}",
        },
    ),
    "servicebus": (
        "serviceBus",
        "namespace",
        "Microsoft.ServiceBus/namespaces",
        {"namespace": "privatelink.servicebus.windows.net"},
    ),
    "cosmos": (
        "cosmos",
        "account",
        "Microsoft.DocumentDB/databaseAccounts",
        {"Sql": "privatelink.documents.azure.com"},
    ),
}
# Left public by decision (identity-only access), each documented in docs/deploy.md "Production posture": the
# scheduler's API version here (2025-11-01) has no publicNetworkAccess; its private endpoints were in limited preview.
PUBLIC_BY_DECISION = {"Microsoft.DurableTask/schedulers": "Durable Task Scheduler"}
# Which output of which module gives each data service's resource id.
TARGET_OUTPUT = {
    "storage": "storage.outputs.storageAccountId",
    "servicebus": "serviceBus.outputs.namespaceId",
    "cosmos": "cosmos.outputs.accountId",
}


def _posture(on: bool) -> Scope:
    return with_params(Scope(main()), vnetEnabled="true" if on else "false")


def _is_vnet_enabled(condition) -> bool:
    return condition is not None and text(condition).strip("() ") == "vnetEnabled"


def _private_endpoint_modules() -> list[Module]:
    return [m for m in main().modules if m.source == "app/private-endpoint.bicep"]


def _service_resource(service: str, on: bool):
    module_symbol, resource_symbol, type_name, _ = DATA_SERVICES[service]
    scope = module_scope(_posture(on), main().module(module_symbol))
    resource = scope.file.resource(resource_symbol)
    assert resource.type == type_name
    return resource, scope


def test_vnet_enabled_is_a_parameter_off_by_default_and_an_azd_variable() -> None:
    assert evaluate(main().params["vnetEnabled"], Scope(main())) is False
    assert "param vnetEnabled bool = false" in main().path.read_text()
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert parameters["vnetEnabled"]["value"] == "${VNET_ENABLED=false}"


@pytest.mark.parametrize("service", sorted(DATA_SERVICES))
def test_data_service_public_network_access_follows_vnet_enabled(service: str) -> None:
    on, on_scope = _service_resource(service, True)
    off, off_scope = _service_resource(service, False)
    assert evaluate(on.get("properties", "publicNetworkAccess"), on_scope) == "Disabled"
    # Off: the public posture, as before the parameter existed.
    assert evaluate(off.get("properties", "publicNetworkAccess"), off_scope) == "Enabled"


def test_storage_firewall_denies_by_default_in_the_private_posture() -> None:
    on, on_scope = _service_resource("storage", True)
    off, off_scope = _service_resource("storage", False)
    assert evaluate(on.get("properties", "networkAcls", "defaultAction"), on_scope) == "Deny"
    assert evaluate(off.get("properties", "networkAcls", "defaultAction"), off_scope) == "Allow"


@pytest.mark.parametrize("service", sorted(DATA_SERVICES))
def test_every_private_link_group_of_a_data_service_has_a_private_endpoint(service: str) -> None:
    _, _, _, zones = DATA_SERVICES[service]
    found: dict[str, str] = {}
    for module in _private_endpoint_modules():
        params = module.params()
        if text(params["targetResourceId"]) != TARGET_OUTPUT[service]:
            continue
        assert _is_vnet_enabled(module.condition), f"{module.symbol} is not conditional on vnetEnabled"
        group = evaluate(params["groupId"], Scope(main()))
        found[group] = text(params["privateDnsZoneName"]).strip("'")
        assert text(params["subnetId"]) == "vnetEnabled ? network.outputs.privateEndpointsSubnetId : ''"
        assert text(params["virtualNetworkId"]) == "vnetEnabled ? network.outputs.virtualNetworkId : ''"
    assert found == zones


def test_the_private_endpoint_module_links_its_zone_and_registers_the_record() -> None:
    module = app("private-endpoint.bicep")
    endpoint = module.resource("privateEndpoint")
    assert endpoint.type == "Microsoft.Network/privateEndpoints"
    connection = code_children(endpoint.get("properties", "privateLinkServiceConnections"))[0]
    scope = Scope(module)
    group_ids = object_get(connection, "properties", "groupIds")
    assert [text(item) for item in code_children(group_ids)] == ["groupId"]
    assert text(object_get(connection, "properties", "privateLinkServiceId")) == "targetResourceId"
    assert text(endpoint.get("properties", "subnet", "id")) == "subnetId"
    zone = module.resource("privateDnsZone")
    assert zone.type == "Microsoft.Network/privateDnsZones"
    assert text(zone.get("name")) == "privateDnsZoneName" and evaluate(zone.get("location"), scope) == "global"
    link = module.resource("virtualNetworkLink")
    assert link.type == "Microsoft.Network/privateDnsZones/virtualNetworkLinks"
    assert text(link.get("properties", "virtualNetwork", "id")) == "virtualNetworkId"
    assert evaluate(link.get("properties", "registrationEnabled"), scope) is False
    group = module.resource("privateDnsZoneGroup")
    assert group.type == "Microsoft.Network/privateEndpoints/privateDnsZoneGroups"
    assert "privateDnsZoneId: privateDnsZone.id" in text(group.body)


def test_service_bus_is_premium_only_in_the_private_posture() -> None:
    on, on_scope = _service_resource("servicebus", True)
    off, off_scope = _service_resource("servicebus", False)
    assert evaluate(on.get("sku"), on_scope) == {"name": "Premium", "tier": "Premium", "capacity": 1}
    # Off: Standard, with no capacity (null: as if absent), as before.
    assert evaluate(off.get("sku"), off_scope) == {"name": "Standard", "tier": "Standard", "capacity": None}


def test_every_data_service_is_private_or_public_by_documented_decision() -> None:
    # A data service added later must join DATA_SERVICES (private endpoint, public access off) or be a documented
    # exception.
    covered = {type_name for _, _, type_name, _ in DATA_SERVICES.values()} | set(PUBLIC_BY_DECISION)
    data_types = {
        "Microsoft.Storage/storageAccounts",
        "Microsoft.ServiceBus/namespaces",
        "Microsoft.DocumentDB/databaseAccounts",
        "Microsoft.DurableTask/schedulers",
        "Microsoft.Sql/servers",
        "Microsoft.KeyVault/vaults",
        "Microsoft.EventHub/namespaces",
        "Microsoft.Cache/redis",
    }
    declared = {r.type for f in (main(), *[app(p.name) for p in (INFRA / "app").glob("*.bicep")]) for r in f.resources}
    assert declared & data_types <= covered, (declared & data_types) - covered
    section = _production_posture()
    for name in PUBLIC_BY_DECISION.values():
        assert f"What stays public, by decision: the **{name}**" in section, name


def test_the_function_app_joins_the_app_subnet() -> None:
    module = main().module("functionApp")
    assert text(module.params()["virtualNetworkSubnetId"]) == "vnetEnabled ? network.outputs.appSubnetId : ''"
    site = app("function.bicep").resource("functionApp")
    subnet = site.get("properties", "virtualNetworkSubnetId")
    assert text(subnet) == "!empty(virtualNetworkSubnetId) ? virtualNetworkSubnetId : null"
    assert evaluate(app("function.bicep").params["virtualNetworkSubnetId"], Scope(app("function.bicep"))) == ""


def _site(vnet: bool, public_deployment: bool | None = None) -> dict:
    values = {"vnetEnabled": "true" if vnet else "false"}
    if public_deployment is not None:
        values["functionPublicDeployment"] = "true" if public_deployment else "false"
    scope = module_scope(with_params(Scope(main()), **values), main().module("functionApp"))
    site = app("function.bicep").resource("functionApp")
    return evaluate(site.get("properties"), scope)


@pytest.mark.parametrize("public_deployment", [True, False], ids=["public-deployment", "all-private"])
def test_with_vnet_enabled_no_public_request_reaches_the_function_apps_routes(public_deployment: bool) -> None:
    site = _site(True, public_deployment)
    # Access restrictions with no allow rule and unmatched traffic denied: the public endpoint serves no route. The
    # private endpoint's traffic is not subject to them (learn.microsoft.com/azure/app-service/
    # overview-access-restrictions: "Access restrictions don't apply to traffic entering through a private endpoint").
    assert site["siteConfig"]["ipSecurityRestrictionsDefaultAction"] == "Deny"
    assert "ipSecurityRestrictions" not in site["siteConfig"]
    assert site["siteConfig"]["scmIpSecurityRestrictionsUseMain"] is False
    if public_deployment:
        # The deployment (SCM) endpoint stays reachable for `azd deploy`, Entra ID only (basic auth is off).
        assert site["publicNetworkAccess"] == "Enabled"
        assert site["siteConfig"]["scmIpSecurityRestrictionsDefaultAction"] == "Allow"
    else:
        assert site["publicNetworkAccess"] == "Disabled"
        assert site["siteConfig"]["scmIpSecurityRestrictionsDefaultAction"] == "Deny"
    assert evaluate(main().params["functionPublicDeployment"], Scope(main())) is True
    assert text(main().module("functionApp").params()["inboundPrivate"]) == "vnetEnabled"


def test_without_vnet_the_function_apps_inbound_side_is_as_before() -> None:
    site = _site(False)
    assert site["publicNetworkAccess"] is None  # null: as if absent
    assert {k: v for k, v in site["siteConfig"].items() if v is not None} == {
        "minTlsVersion": "1.2",
        "ftpsState": "Disabled",
    }


def test_the_function_app_has_a_private_endpoint_for_its_sites() -> None:
    (module,) = [
        m
        for m in _private_endpoint_modules()
        if text(m.params()["targetResourceId"]) == "functionApp.outputs.functionAppId"
    ]
    assert _is_vnet_enabled(module.condition)
    params = module.params()
    assert evaluate(params["groupId"], Scope(main())) == "sites"
    # One zone serves <app>.azurewebsites.net and <app>.scm.azurewebsites.net inside the VNet.
    assert evaluate(params["privateDnsZoneName"], Scope(main())) == "privatelink.azurewebsites.net"
    assert text(params["subnetId"]) == "vnetEnabled ? network.outputs.privateEndpointsSubnetId : ''"
    assert text(params["virtualNetworkId"]) == "vnetEnabled ? network.outputs.virtualNetworkId : ''"
    function = app("function.bicep")
    assert function.outputs["functionAppId"].text.decode() == "functionApp.id"
    section = _production_posture()
    for needle in ("privatelink.azurewebsites.net", "functionPublicDeployment", "jump box", "Bastion"):
        assert needle in section, needle


def test_the_agent_environment_joins_the_agent_subnet() -> None:
    module = main().module("agent")
    assert text(module.params()["infrastructureSubnetId"]) == "vnetEnabled ? network.outputs.agentSubnetId : ''"
    environment = app("agent.bicep").resource("environment")
    assert environment.type == "Microsoft.App/managedEnvironments"
    vnet = environment.get("properties", "vnetConfiguration")
    assert vnet is not None and vnet.type == "ternary_expression"
    condition, when_set, when_unset = code_children(vnet)
    assert text(condition) == "!empty(infrastructureSubnetId)" and text(when_unset) == "null"
    assert text(object_get(when_set, "infrastructureSubnetId")) == "infrastructureSubnetId"
    assert evaluate(object_get(when_set, "internal"), Scope(app("agent.bicep"))) is True  # no ingress: no public IP


def test_network_subnets() -> None:
    network = app("network.bicep")
    scope = Scope(network)
    vnet = network.resource("virtualNetwork")
    assert vnet.type == "Microsoft.Network/virtualNetworks"
    subnets = evaluate(vnet.get("properties", "subnets"), scope)
    by_name = {s["name"]: s["properties"] for s in subnets}
    assert set(by_name) == {"app", "private-endpoints", "agent"}
    # Flex Consumption's VNet integration needs its subnet delegated to Microsoft.App/environments.
    assert [d["properties"]["serviceName"] for d in by_name["app"]["delegations"]] == ["Microsoft.App/environments"]
    assert by_name["private-endpoints"]["privateEndpointNetworkPolicies"] == "Disabled"
    # The Agent's environment is Consumption-only (no workload profiles): a /23 at least, not delegated.
    assert "workloadProfiles" not in text(app("agent.bicep").resource("environment").body)
    assert "delegations" not in by_name["agent"]
    assert int(by_name["agent"]["addressPrefix"].rsplit("/", 1)[1]) <= 23
    for output in ("appSubnetId", "privateEndpointsSubnetId", "agentSubnetId", "virtualNetworkId"):
        assert output in network.outputs


def test_everything_the_private_posture_adds_is_conditional_on_vnet_enabled() -> None:
    added = [m for m in main().modules if m.source in ("app/network.bicep", "app/private-endpoint.bicep")]
    assert {m.symbol for m in added} >= {"network", "storageBlobPrivateEndpoint", "cosmosPrivateEndpoint"}
    for module in added:
        assert _is_vnet_enabled(module.condition), f"{module.symbol} is deployed with vnetEnabled off"
    # Every use of the network module's outputs is guarded, so nothing reads a module that was not deployed.
    for module in main().modules:
        for key, value in module.params().items():
            if "network.outputs." in text(value):
                assert text(value).startswith("vnetEnabled ? network.outputs."), f"{module.symbol}.{key}"
                assert evaluate(value, _posture(False)) == "", f"{module.symbol}.{key} off"
    # Network resources live only in the modules that vnetEnabled guards.
    for bicep in (main(), *[app(p.name) for p in (INFRA / "app").glob("*.bicep")]):
        if bicep.name in ("app/network.bicep", "app/private-endpoint.bicep"):
            continue
        assert not [r for r in bicep.resources if r.type.startswith("Microsoft.Network/")], bicep.name


@pytest.mark.parametrize("service", sorted(DATA_SERVICES))
def test_data_modules_receive_vnet_enabled(service: str) -> None:
    module_symbol = DATA_SERVICES[service][0]
    assert text(main().module(module_symbol).params()["vnetEnabled"]) == "vnetEnabled"


def _production_posture() -> str:
    doc = (REPO / "docs" / "deploy.md").read_text()
    start = doc.lower().find("## production posture")
    assert start >= 0, "docs/deploy.md has no 'Production posture' section"
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end >= 0 else len(doc)]


def test_docs_production_posture_covers_vnet_sku_alert_email_and_scaling() -> None:
    section = _production_posture()
    for needle in (
        "azd env set VNET_ENABLED true",
        "Premium",
        "Standard",
        "private endpoint",
        "alertEmail",
        "ORDERFLOW_ALERT_EMAIL",
        "maximumInstanceCount",
        "alwaysReady",
        "Agent telemetry and scaling",
        "serverless",
        "autoscale",
    ):
        assert needle in section, needle
    assert "VNET_ENABLED" in (REPO / "README.md").read_text()
