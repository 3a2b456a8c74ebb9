"""App settings: the function app's settings in Bicep equal the set the code reads
(orderflow/settings.SETTINGS), apart from the settings the Functions host owns; host.json and
local.settings.sample.json agree with them.

The rule, written once here:
    Bicep app settings - host-owned settings == SETTINGS - local-only settings
    host-owned: AzureWebJobsStorage__*, APPLICATIONINSIGHTS_*, AzureFunctionsJobHost__* (host.json
        overrides), the Service Bus extension's identity keys of the binding connection
        (ServiceBusConnection__credential, ServiceBusConnection__clientId), the Durable Task Scheduler
        connection string, PYTHON_ENABLE_OPENTELEMETRY (read by the Python worker), and every %Setting% that
        host.json references.
    local-only: settings whose registry doc says "Local only" (ServiceBusConnection, the embedded broker's
        connection string; Azure uses ServiceBusConnection__fullyQualifiedNamespace instead).
FUNCTIONS_WORKER_RUNTIME and FUNCTIONS_EXTENSION_VERSION are not app settings on Flex Consumption (the
runtime is functionAppConfig.runtime), so Bicep must not set them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from support.bicep_tree import REPO, Opaque, Scope, app, evaluate, main, module_scope, object_items, text, with_params
from tree_sitter import Node

from orderflow import settings

HOST_OWNED_PREFIXES = ("AzureWebJobsStorage__", "APPLICATIONINSIGHTS_", "AzureFunctionsJobHost__")
HOST_OWNED_NAMES = {
    "ServiceBusConnection__credential",
    "ServiceBusConnection__clientId",
    "DURABLE_TASK_SCHEDULER_CONNECTION_STRING",
    "PYTHON_ENABLE_OPENTELEMETRY",
}
LOCAL_ONLY = {s.name for s in settings.SETTINGS if s.doc.startswith("Local only")}
# Settings App Service itself sets (WEBSITE_AUTH_ENABLED when authentication is on: learn.microsoft.com
# app-service/reference-app-settings, "Authentication & Authorization"): read by the code, never written by infra/.
PLATFORM_SET = {s.name for s in settings.SETTINGS if s.doc.startswith("Set by App Service")}
HOST_JSON = json.loads((REPO / "host.json").read_text())
SAMPLE = json.loads((REPO / "local.settings.sample.json").read_text())  # devhost's
FUNC_SAMPLE = json.loads((REPO / "local.settings.func.sample.json").read_text())  # `func start`'s
AZURE_ONLY = {
    "CosmosDb__clientId",
    "AZURE_CLIENT_ID",
    "ServiceBusConnection__fullyQualifiedNamespace",
    "ServiceBusNamespaceResourceId",
}
FUNC_START_SECTION = (REPO / "README.md").read_text().split("### With `func start` and Azurite", 1)[1]
FUNC_START_SECTION = FUNC_START_SECTION.split("\n## ", 1)[0]
# The Service Bus emulator's connection string (learn.microsoft.com/azure/service-bus-messaging/overview-emulator),
# its fixed placeholder key included, on the default AMQP port of `python -m devhost servicebus`, with the function
# app's identity as its SAS key name (the endpoint checks the rights infra/ grants it: docs/devhost.md, "Rights").
EMULATOR_CONNECTION = (
    "Endpoint=sb://127.0.0.1;SharedAccessKeyName=function-app;SharedAccessKey=SAS_KEY_VALUE;"
    "UseDevelopmentEmulator=true;"
)
# The settings the Starter (function app) and the Agent must both read alike: they share the breaker documents.
BREAKER_TUNABLES = (
    "RemoteServiceName",
    "CircuitBreakerFailureThreshold",
    "CircuitBreakerWindowSeconds",
    "CircuitBreakerCooldownSeconds",
    "CircuitBreakerMaxCooldownSeconds",
    "CircuitBreakerProbes",
)
AGENT_ENV = {
    "AgentRequestsQueueName",
    "AgentRepliesQueueName",
    "OperatorAlertsQueueName",
    "ServiceBusConnection__fullyQualifiedNamespace",
    "AZURE_CLIENT_ID",
    "AGENT_REMOTE_URL",
    # Telemetry (orderflow.telemetry.configure_from_env): as the function app's, Entra ID ingestion.
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "OTEL_SERVICE_NAME",
    # The circuit-breaker documents (issue 11): Cosmos DB with the Agent's identity, and the breaker's tunables.
    "CosmosDb__accountEndpoint",
    "CosmosDb__clientId",
    "StateDatabaseName",
    "CircuitBreakerContainerName",
    *BREAKER_TUNABLES,
    # The port of the health endpoint the liveness probe calls (agent.bicep; tests/product/infra/test_agent_deploy.py).
    "AGENT_HEALTH_PORT",
}
# Registered settings whose default is the empty string (MaxPendingOrdersPerApp): a sample may list them empty, which
# is their default, not a value that shadows one.
EMPTY_BY_DEFAULT = {s.name for s in settings.SETTINGS if s.default == ""}


def host_json_references() -> set[str]:
    return set(re.findall(r"%([A-Za-z0-9_]+)%", json.dumps(HOST_JSON)))


def is_host_owned(name: str) -> bool:
    return name.startswith(HOST_OWNED_PREFIXES) or name in HOST_OWNED_NAMES | host_json_references()


def _object_nodes(node: Node) -> list[Node]:
    """The object literal(s) an app-settings part can be: a variable, or either branch of a condition."""
    function = app("function.bicep")
    if node.type == "identifier" and text(node) in function.variables:
        return _object_nodes(function.variables[text(node)])
    if node.type == "ternary_expression":
        return [o for branch in node.named_children[1:] for o in _object_nodes(branch)]
    return [node] if node.type == "object" else []


def bicep_app_settings() -> dict[str, Node]:
    """Every app setting the function app can get: the keys of each part of union(...), both branches of each
    condition (the `appSettingOverrides` parameter only changes values)."""
    properties = app("function.bicep").resource("appSettings").get("properties")
    assert properties is not None and text(properties.named_children[0]) == "union"
    found: dict[str, Node] = {}
    for part in properties.named_children[-1].named_children:
        for obj in _object_nodes(part):
            found.update(dict(object_items(obj)))
    return found


def _function_scope() -> Scope:
    return module_scope(Scope(main()), main().module("functionApp"))


def test_local_only_rule_is_what_the_registry_says() -> None:
    assert LOCAL_ONLY == {"ServiceBusConnection"}


def test_bicep_app_settings_equal_the_settings_the_code_reads() -> None:
    code_side = {name for name in bicep_app_settings() if not is_host_owned(name)}
    assert PLATFORM_SET == {"WEBSITE_AUTH_ENABLED"} and not PLATFORM_SET & set(bicep_app_settings())
    assert code_side == settings.SETTING_NAMES - LOCAL_ONLY - PLATFORM_SET


def test_no_local_only_or_flex_forbidden_setting_in_bicep() -> None:
    names = set(bicep_app_settings())
    assert not names & LOCAL_ONLY
    assert not names & {
        "FUNCTIONS_WORKER_RUNTIME",
        "FUNCTIONS_EXTENSION_VERSION",
        "AzureWebJobsStorage",
        "WEBSITE_RUN_FROM_PACKAGE",
        "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    }


def test_connections_are_identity_based() -> None:
    names = set(bicep_app_settings())
    assert {
        "AzureWebJobsStorage__blobServiceUri",
        "AzureWebJobsStorage__queueServiceUri",
        "AzureWebJobsStorage__tableServiceUri",
        "AzureWebJobsStorage__credential",
        "AzureWebJobsStorage__clientId",
        "ServiceBusConnection__fullyQualifiedNamespace",
        "ServiceBusConnection__credential",
        "ServiceBusConnection__clientId",
        "CosmosDb__accountEndpoint",
        "CosmosDb__credential",
        "CosmosDb__clientId",
        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    } <= names
    values = {name: evaluate(node, _function_scope()) for name, node in bicep_app_settings().items()}
    for name in (
        "AzureWebJobsStorage__credential",
        "ServiceBusConnection__credential",
        "CosmosDb__credential",
    ):
        assert values[name] == "managedidentity"
    for name in (
        "AzureWebJobsStorage__clientId",
        "ServiceBusConnection__clientId",
        "CosmosDb__clientId",
        "AZURE_CLIENT_ID",
    ):
        assert text(bicep_app_settings()[name]) == "identityClientId"
    assert "Authorization=AAD" in text(bicep_app_settings()["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"])


def test_bicep_values_are_the_registered_defaults() -> None:
    scope = _function_scope()
    checked = 0
    for name, node in bicep_app_settings().items():
        value: Any = evaluate(node, scope)
        if name in settings.SETTING_NAMES and not isinstance(value, Opaque) and name != "CosmosDb__credential":
            assert value == settings.get(name, env={}), name
            checked += 1
    # Tunables are literals; names of queues, databases and containers flow from main.bicep's parameters.
    assert checked >= 20


def test_host_json_references_are_set_in_bicep_and_in_the_sample() -> None:
    references = host_json_references()
    assert references == {"TaskHubName"}
    assert references <= set(bicep_app_settings())
    assert references <= set(SAMPLE["Values"])
    assert references <= set(FUNC_SAMPLE["Values"])


def test_host_json() -> None:
    assert HOST_JSON["version"] == "2.0"
    assert HOST_JSON["telemetryMode"] == "OpenTelemetry"
    assert HOST_JSON["extensionBundle"] == {
        "id": "Microsoft.Azure.Functions.ExtensionBundle",
        "version": "[4.32.0, 5.0.0)",  # 4.30+: orchestration versions (defaultVersion); 4.32+: Durable Task Scheduler
    }
    durable = HOST_JSON["extensions"]["durableTask"]
    assert durable["hubName"] == "%TaskHubName%"
    # No storageProvider type or connection: the default provider (Azure Storage) on the default connection
    # (AzureWebJobsStorage); only its polling bound (tests/product/infra/test_crash_budget.py). See
    # test_durable_task_scheduler_override_leaves_no_stray_connection_name.
    assert set(durable["storageProvider"]) == {"maxQueuePollingInterval"}
    service_bus = HOST_JSON["extensions"]["serviceBus"]
    # Per-function settlement: the submission trigger passes auto_complete_messages=False and settles with
    # ServiceBusMessageActions; triggers that do not settle explicitly rely on the host completing on success.
    assert service_bus["autoCompleteMessages"] is True
    assert service_bus["maxConcurrentSessions"] >= 1 and service_bus["maxConcurrentCalls"] >= 1
    assert "logLevel" in HOST_JSON["logging"]


def _dts_overrides() -> dict[str, Node]:
    return {
        k: n
        for obj in _object_nodes(app("function.bicep").variables["durableTaskSchedulerSettings"])
        for k, n in object_items(obj)
    }


def test_durable_task_scheduler_switch_overrides_host_json() -> None:
    keys = _dts_overrides()
    assert (
        evaluate(keys["AzureFunctionsJobHost__extensions__durableTask__storageProvider__type"], _function_scope())
        == "azureManaged"
    )
    connection = text(keys["DURABLE_TASK_SCHEDULER_CONNECTION_STRING"])
    assert "Authentication=ManagedIdentity" in connection and "ClientID=${identityClientId}" in connection


def effective_storage_provider(host_json: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """host.json's durableTask.storageProvider with the AzureFunctionsJobHost__ app settings applied, as the host's
    configuration does: an environment key `AzureFunctionsJobHost__a__b` sets `a:b` over host.json and removes
    nothing (Microsoft.Extensions.Configuration layering; "host.json settings can be overridden by app settings",
    Functions host.json reference)."""
    section = dict(((host_json.get("extensions") or {}).get("durableTask") or {}).get("storageProvider") or {})
    prefix = "AzureFunctionsJobHost__extensions__durableTask__storageProvider__"
    section.update({k[len(prefix) :]: v for k, v in overrides.items() if k.startswith(prefix)})
    return section


def test_durable_task_scheduler_override_leaves_no_stray_connection_name() -> None:
    overrides = {k: evaluate(n, _function_scope()) for k, n in _dts_overrides().items()}
    # The Durable Task Scheduler docs configure the provider as { type: azureManaged, connectionStringName }. The
    # Azure Storage polling bound stays in the section and is inert there: DurableTaskOptions.StorageProvider is a
    # dictionary from which each provider's factory takes its own keys (azure-functions-durable-extension,
    # AzureStorageDurabilityProviderFactory populates AzureStorageOptions from it; nothing else reads that key).
    assert effective_storage_provider(HOST_JSON, overrides) == {
        "type": "azureManaged",
        "connectionStringName": "DURABLE_TASK_SCHEDULER_CONNECTION_STRING",
        "maxQueuePollingInterval": HOST_JSON["extensions"]["durableTask"]["storageProvider"]["maxQueuePollingInterval"],
    }
    # The merge keeps what host.json says: a host.json connectionName would survive the override.
    stray = {"extensions": {"durableTask": {"storageProvider": {"connectionName": "AzureWebJobsStorage"}}}}
    assert "connectionName" in effective_storage_provider(stray, overrides)


def test_python_worker_opentelemetry_is_enabled_where_the_app_configures_it() -> None:
    # host.json telemetryMode OpenTelemetry + the app's own configure_azure_monitor (orderflow/telemetry.py, called from
    # function_app.py): the Python worker needs PYTHON_ENABLE_OPENTELEMETRY=true to report the OpenTelemetry
    # capability and carry the host's trace context (azure-functions-python-worker, worker init request), and must
    # not get PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY, with which it calls configure_azure_monitor a second time.
    assert HOST_JSON["telemetryMode"] == "OpenTelemetry"
    assert "telemetry.configure_from_env()" in (REPO / "function_app.py").read_text()
    assert "configure_azure_monitor(" in (REPO / "orderflow" / "telemetry.py").read_text()
    names = bicep_app_settings()
    assert evaluate(names["PYTHON_ENABLE_OPENTELEMETRY"], _function_scope()) == "true"
    assert "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY" not in names
    for sample in (SAMPLE, FUNC_SAMPLE):
        assert sample["Values"]["PYTHON_ENABLE_OPENTELEMETRY"] == "true"
        assert "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY" not in sample["Values"]


def test_sample_lists_every_registered_setting() -> None:
    for values in (SAMPLE["Values"], FUNC_SAMPLE["Values"]):
        for setting in settings.SETTINGS:
            if setting.default is not None and setting.name in values:
                assert values[setting.name] == setting.default, setting.name
    for setting in settings.SETTINGS:
        if setting.default is not None:
            assert setting.name in SAMPLE["Values"], setting.name
        elif setting.name in AZURE_ONLY:
            # A user-assigned identity's client id and the namespace's identity-based connection and ARM id: Azure
            # only (infra). Both samples are zero cloud; README's `func start` section names them for Azure resources.
            assert setting.name not in SAMPLE["Values"] and setting.name not in FUNC_SAMPLE["Values"]
            assert setting.name in FUNC_START_SECTION or setting.name in {"CosmosDb__clientId", "AZURE_CLIENT_ID"}
        else:
            assert setting.name in SAMPLE["Values"] or setting.name in FUNC_SAMPLE["Values"], setting.name


def test_sample_runs_locally_with_zero_cloud() -> None:
    values = SAMPLE["Values"]
    assert values["FUNCTIONS_WORKER_RUNTIME"] == "python"
    assert values["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"
    # Both as the function app's identity: the stand-ins check the rights infra/ grants it (docs/devhost.md, "Rights").
    assert values["ServiceBusConnection"] == (
        "Endpoint=embedded://.devhost/servicebus.db;ConfigFile=servicebus.config.json;Identity=function-app"
    )
    assert values["CosmosDb__accountEndpoint"] == "embedded://.devhost/store.db?identity=function-app"
    assert [k for k, v in values.items() if v == "" and k not in EMPTY_BY_DEFAULT] == [], (
        "an empty value shadows a default"
    )
    # One sample per host: no block of `func start` values to move around (local.settings.func.sample.json has them).
    assert set(SAMPLE) == {"//", "IsEncrypted", "Values"} == set(FUNC_SAMPLE)


def test_func_start_sample_is_zero_cloud_azurite_the_amqp_endpoint_and_the_embedded_store() -> None:
    values = FUNC_SAMPLE["Values"]
    assert values["FUNCTIONS_WORKER_RUNTIME"] == "python"
    assert values["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"  # Azurite: host storage and task hub
    # The real host's Service Bus extension cannot use the embedded broker's file, but it speaks AMQP to
    # `python -m devhost servicebus` with the Service Bus emulator's connection string (Azure.Messaging.ServiceBus
    # reads UseDevelopmentEmulator=true: plain AMQP, port 5672 when none is given; azure-servicebus does the same,
    # azure/servicebus/_servicebus_client.py from_connection_string). Nothing else on the namespace: no ARM id.
    assert values["ServiceBusConnection"] == EMULATOR_CONNECTION
    assert "ServiceBusConnection__fullyQualifiedNamespace" not in values
    assert "ServiceBusNamespaceResourceId" not in values
    # The embedded store runs inside the Python worker (orderflow/adapters.py picks it for embedded://).
    assert values["CosmosDb__accountEndpoint"] == "embedded://.devhost/store.db"
    assert not [k for k in values if k.endswith(("__credential", "__clientId"))]
    assert [k for k, v in values.items() if v == "" and k not in EMPTY_BY_DEFAULT] == [], (
        "an empty value shadows a default"
    )
    # The two samples differ exactly in the connections; every tunable is the same.
    connections = {
        "ServiceBusConnection",
        "ServiceBusConnection__fullyQualifiedNamespace",
        "CosmosDb__accountEndpoint",
        "CosmosDb__credential",
        "ServiceBusNamespaceResourceId",
    }
    devhost = {k: v for k, v in SAMPLE["Values"].items() if k not in connections}
    func = {k: v for k, v in values.items() if k not in connections}
    # ...and in the Easy Auth switch: devhost has a stand-in of App Service authentication in front of the operator
    # routes; `func start` has none, so the app must not trust a principal header there (docs/devhost.md).
    assert devhost.pop("WEBSITE_AUTH_ENABLED") == "True" and "WEBSITE_AUTH_ENABLED" not in func
    assert devhost == func


def test_agent_environment() -> None:
    agent = app("agent.bicep").resource("agent")
    containers = agent.get("properties", "template", "containers")
    (container,) = containers.named_children
    scope = module_scope(Scope(main()), main().module("agent"))
    env = {item["name"]: item["value"] for item in evaluate(container, scope)["env"]}
    assert set(env) == AGENT_ENV
    for name in AGENT_ENV & settings.SETTING_NAMES - {
        "ServiceBusConnection__fullyQualifiedNamespace",
        "AZURE_CLIENT_ID",
        "CosmosDb__accountEndpoint",
        "CosmosDb__clientId",
    }:
        assert env[name] == settings.get(name, env={}), name
    assert "command" not in evaluate(container, scope)  # the image's CMD runs: tests/product/infra/test_agent_deploy.py


def _agent_env(scope: Scope) -> dict[str, Any]:
    (container,) = app("agent.bicep").resource("agent").get("properties", "template", "containers").named_children
    return {item["name"]: item["value"] for item in evaluate(container, scope)["env"]}


def test_agent_reaches_the_breaker_container_with_its_own_identity() -> None:
    scope = module_scope(Scope(main()), main().module("agent"))
    env = _agent_env(scope)
    assert isinstance(env["CosmosDb__accountEndpoint"], Opaque)
    assert env["CosmosDb__accountEndpoint"].text == "cosmos.outputs.endpoint"
    # orderflow.adapters opens Cosmos DB with DefaultAzureCredential(managed_identity_client_id=CosmosDb__clientId).
    for name in ("CosmosDb__clientId", "AZURE_CLIENT_ID"):
        assert isinstance(env[name], Opaque) and env[name].text == "identity.outputs.agentClientId", name
    # The same database and container names as the function app and the Cosmos module (main.bicep's parameters).
    agent, function, cosmos = (main().module(m).params() for m in ("agent", "functionApp", "cosmos"))
    for key in ("stateDatabaseName", "circuitBreakerContainerName"):
        assert text(agent[key]) == text(function[key]) == text(cosmos[key]) == key


def test_agent_breaker_settings_equal_the_function_apps_with_the_same_overrides() -> None:
    function = {name: evaluate(node, _function_scope()) for name, node in bicep_app_settings().items()}
    agent = _agent_env(module_scope(Scope(main()), main().module("agent")))
    for name in BREAKER_TUNABLES:
        assert agent[name] == function[name] == settings.get(name, env={}), name
    # appSettingOverrides reaches both: the function app through union(...), the Agent through breakerSettings.
    assert text(main().module("agent").params()["settingOverrides"]) == "appSettingOverrides"
    assert text(main().module("functionApp").params()["appSettingOverrides"]) == "appSettingOverrides"
    overridden = with_params(Scope(main()), appSettingOverrides="{ CircuitBreakerProbes: '5' }")
    agent = _agent_env(module_scope(overridden, main().module("agent")))
    assert agent["CircuitBreakerProbes"] == "5"
    assert agent["CircuitBreakerFailureThreshold"] == settings.get("CircuitBreakerFailureThreshold", env={})
