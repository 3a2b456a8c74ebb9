"""The recovery index (issue 12, part 4): a container of the state database, partition key /bucket (a CompleteBy time
bucket), entries expiring after 7 days, a composite index for the Supervisor's ordered bucket scan; its name, the
scan mode and the bucket width as app settings with the registered defaults; the function app reaches it through its
Data Contributor grant on the state database, the Agent cannot reach it at all.
"""

from __future__ import annotations

from typing import Any

from support.bicep_tree import Scope, app, evaluate, literal, main, module_scope, text, with_params

from orderflow import settings
from orderflow.azure import cosmos

SEVEN_DAYS = 7 * 24 * 60 * 60
NEW_SETTINGS = ("SupervisorScanMode", "RecoveryIndexContainerName", "RecoveryIndexBucketSeconds")
STATE_DATABASE_SCOPE = "'${cosmosAccount.id}/dbs/${stateDatabaseName}'"
BREAKER_SCOPE = "'${cosmosAccount.id}/dbs/${stateDatabaseName}/colls/${circuitBreakerContainerName}'"


def _default(name: str) -> str:
    return settings.get(name, env={})


def _container(scope: Scope | None = None) -> dict[str, Any]:
    scope = scope or module_scope(Scope(main()), main().module("cosmos"))
    return evaluate(scope.file.resource("recoveryIndexContainer").get("properties", "resource"), scope)


def _code_settings(caller: Scope) -> dict[str, Any]:
    """The function app's code settings with appSettingOverrides merged over them, as union(...) in function.bicep
    does (the host and Durable parts hold none of these names)."""
    function = app("function.bicep")
    properties = function.resource("appSettings").get("properties")
    assert text(properties).replace(" ", "").endswith("codeSettings,appSettingOverrides)"), "overrides win last"
    scope = module_scope(caller, main().module("functionApp"))
    return {**evaluate(function.variables["codeSettings"], scope), **evaluate(literal("appSettingOverrides"), scope)}


# ---- the container ----


def test_the_container_is_in_the_state_database_and_named_by_the_setting() -> None:
    cosmos = module_scope(Scope(main()), main().module("cosmos"))
    resource = cosmos.file.resource("recoveryIndexContainer")
    assert text(resource.get("parent")) == "stateDatabase"
    assert evaluate(resource.get("name"), cosmos) == _container()["id"] == _default("RecoveryIndexContainerName")
    # main.bicep's parameter defaults to the setting's default and is the one name the Cosmos module and the function
    # app get: a name chosen at deployment reaches the container and the app setting alike.
    assert evaluate(main().params["recoveryIndexContainerName"], Scope(main())) == _default(
        "RecoveryIndexContainerName"
    )
    for module in ("cosmos", "functionApp"):
        assert text(main().module(module).params()["recoveryIndexContainerName"]) == "recoveryIndexContainerName"
    renamed = with_params(Scope(main()), recoveryIndexContainerName="'recoveryIndex2'")
    assert _container(module_scope(renamed, main().module("cosmos")))["id"] == "recoveryIndex2"
    assert _code_settings(renamed)["RecoveryIndexContainerName"] == "recoveryIndex2"


def test_the_partition_key_is_the_completeby_bucket() -> None:
    assert _container()["partitionKey"] == {"paths": ["/bucket"], "kind": "Hash", "version": 2}
    # The adapter's side of the contract: the partition path it writes (and creates the container with locally).
    assert cosmos.INDEX_PARTITION_PATH == "/bucket"


def test_entries_expire_seven_days_after_their_last_write() -> None:
    # Container defaultTtl n: an item without its own ttl expires n seconds after its last modification (Time to Live
    # in Azure Cosmos DB, https://learn.microsoft.com/azure/cosmos-db/nosql/time-to-live).
    assert _container()["defaultTtl"] == SEVEN_DAYS == 604800
    # Nothing else expires by default: checkpoints and breakers have no TTL; orders and order state have TTL on with no
    # default expiry (-1), so only the per-item ttl the app sets on a finished order expires them (issue 26,
    # test_infra_retention.py).
    cosmos = module_scope(Scope(main()), main().module("cosmos"))
    for resource in cosmos.file.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers"):
        if resource.symbol != "recoveryIndexContainer":
            assert evaluate(resource.get("properties", "resource", "defaultTtl"), cosmos) in (None, -1), resource.symbol


def test_the_bucket_scan_has_its_composite_index() -> None:
    # The Supervisor pages one bucket with ORDER BY completeBy, orderId: an ORDER BY on two or more properties needs a
    # composite index in that order, within one partition too (Azure Cosmos DB indexing policies, composite indexes,
    # https://learn.microsoft.com/azure/cosmos-db/index-policy#composite-indexes).
    policy = _container()["indexingPolicy"]
    assert policy["indexingMode"] == "consistent"
    composites = [[(p["path"], p["order"]) for p in index] for index in policy["compositeIndexes"]]
    assert [("/completeBy", "ascending"), ("/orderId", "ascending")] in composites
    assert {p["path"] for p in policy["includedPaths"]} == {"/*"}
    # The adapter's side of the contract: the query it runs, and the policy it creates the container with where it
    # creates containers itself (the emulator; ensure_containers). Bicep must be the same policy.
    assert "ORDER BY c.completeBy ASC, c.orderId ASC" in cosmos._INDEX_PAGE_SQL
    assert policy == cosmos.INDEX_INDEXING_POLICY


# ---- app settings ----


def test_the_scan_settings_have_the_registered_defaults_and_take_overrides() -> None:
    values = _code_settings(Scope(main()))
    for name in NEW_SETTINGS:
        assert values[name] == _default(name), name
    assert values["SupervisorScanMode"] == "query" and values["RecoveryIndexBucketSeconds"] == "300"
    switched = with_params(Scope(main()), appSettingOverrides="{ SupervisorScanMode: 'index' }")
    assert _code_settings(switched)["SupervisorScanMode"] == "index"
    assert _code_settings(switched)["RecoveryIndexBucketSeconds"] == "300"


def test_the_agent_gets_none_of_the_scan_settings() -> None:
    (container,) = app("agent.bicep").resource("agent").get("properties", "template", "containers").named_children
    env = {item["name"] for item in evaluate(container, module_scope(Scope(main()), main().module("agent")))["env"]}
    assert not env & set(NEW_SETTINGS)
    assert "recoveryIndexContainerName" not in main().module("agent").params()


# ---- grants ----


def _app_cosmos_scopes() -> set[str]:
    return {
        text(g.get("properties", "scope"))
        for g in app("rbac.bicep").resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
        if text(g.get("properties", "principalId")) == "appPrincipalId"
    }


def test_the_function_app_reaches_the_index_through_its_state_database_grant() -> None:
    # Data Contributor on the state database covers every container in it: the Supervisor's queries and deletes, and
    # the index writes before each CompleteBy change (Starter claim, step deadline).
    rbac = app("rbac.bicep")
    assert STATE_DATABASE_SCOPE in _app_cosmos_scopes()
    (grant,) = [
        g
        for g in rbac.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
        if text(g.get("properties", "scope")) == STATE_DATABASE_SCOPE
        and text(g.get("properties", "principalId")) == "appPrincipalId"
    ]
    assert text(grant.get("properties", "roleDefinitionId")) == (
        "'${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataContributor}'"
    )
    assert evaluate(rbac.variables["cosmosDataContributor"], Scope(rbac)) == "00000000-0000-0000-0000-000000000002"
    # The grant's database and the container's parent are the same main.bicep parameter.
    assert text(main().module("rbac").params()["stateDatabaseName"]) == "stateDatabaseName"
    assert text(main().module("cosmos").params()["stateDatabaseName"]) == "stateDatabaseName"


def test_the_agent_cannot_reach_the_index() -> None:
    rbac = app("rbac.bicep")
    # rbac.bicep is never told the index's name, so no grant or role can be scoped to it by name ...
    assert "recoveryIndexContainerName" not in rbac.params
    assert "recoveryIndexContainerName" not in main().module("rbac").params()
    assert "recoveryIndex" not in "".join(text(r.body) for r in rbac.resources)
    # ... the Agent's Cosmos grants and its custom role are the breaker container only (not the state database) ...
    agent_scopes = [
        text(g.get("properties", "scope"))
        for g in rbac.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
        if text(g.get("properties", "principalId")) == "agentPrincipalId"
    ]
    assert agent_scopes == [BREAKER_SCOPE]
    roles = rbac.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions")
    scopes = {r.symbol: [text(s) for s in r.get("properties", "assignableScopes").named_children] for r in roles}
    assert scopes["circuitBreakerRole"] == [BREAKER_SCOPE]
    assert all("recoveryIndex" not in "".join(v) for v in scopes.values())  # the operators' keep role: orders only
    # ... and the breaker container is another container than the index.
    defaults = {
        name: evaluate(main().params[name], Scope(main()))
        for name in ("circuitBreakerContainerName", "recoveryIndexContainerName")
    }
    assert defaults["circuitBreakerContainerName"] != defaults["recoveryIndexContainerName"]
