"""Service Bus in Bicep: Standard tier, the pattern's queue properties, equal to servicebus.config.json (what
the embedded broker runs locally), and one inbound and one status queue per submitting application; the local
broker's queues are exactly the ones main.bicep creates for the local system's apps (the rights' local deployment).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.bicep_tree import REPO, Scope, app, evaluate, loop_parts, main, module_scope

from orderflow import apps, settings
from orderflow.embedded.rights._grants import local_deployment

CONFIG_TO_BICEP = {
    "RequiresSession": "requiresSession",
    "RequiresDuplicateDetection": "requiresDuplicateDetection",
    "DuplicateDetectionHistoryTimeWindow": "duplicateDetectionHistoryTimeWindow",
    "LockDuration": "lockDuration",
    "MaxDeliveryCount": "maxDeliveryCount",
    "DefaultMessageTimeToLive": "defaultMessageTimeToLive",
    "DeadLetteringOnMessageExpiration": "deadLetteringOnMessageExpiration",
}
QUEUE_SYMBOLS = {
    "ordersQueue": "OrdersQueueName",
    "agentRequestsQueue": "AgentRequestsQueueName",
    "agentRepliesQueue": "AgentRepliesQueueName",
    "operatorAlertsQueue": "OperatorAlertsQueueName",
}


def _scope() -> Scope:
    return module_scope(Scope(main()), main().module("serviceBus"))


def _queue(symbol: str) -> tuple[str, dict[str, Any]]:
    scope = _scope()
    queue = scope.file.resource(symbol)
    assert queue.type == "Microsoft.ServiceBus/namespaces/queues"
    return evaluate(queue.get("name"), scope), evaluate(queue.get("properties"), scope)


def _config_queues() -> dict[str, dict[str, Any]]:
    config = json.loads((REPO / "servicebus.config.json").read_text())
    (namespace,) = config["UserConfig"]["Namespaces"]
    return {q["Name"]: q["Properties"] for q in namespace["Queues"]}


def test_namespace_is_standard() -> None:
    namespace = app("servicebus.bicep").resource("namespace")
    assert evaluate(namespace.get("sku", "name"), Scope(namespace.file)) == "Standard"


@pytest.mark.parametrize("symbol", sorted(QUEUE_SYMBOLS))
def test_queue_names_are_the_settings_defaults(symbol: str) -> None:
    name, _ = _queue(symbol)
    assert name == settings.get(QUEUE_SYMBOLS[symbol], env={})


@pytest.mark.parametrize("symbol", ["ordersQueue", "agentRequestsQueue", "agentRepliesQueue"])
def test_pattern_queues_have_sessions_duplicate_detection_and_dead_lettering(symbol: str) -> None:
    _, properties = _queue(symbol)
    assert properties["requiresSession"] is True  # SessionId = orderId (Sequential Convoy)
    assert properties["requiresDuplicateDetection"] is True
    assert properties["duplicateDetectionHistoryTimeWindow"].startswith("PT")
    assert properties["deadLetteringOnMessageExpiration"] is True
    assert 1 <= properties["maxDeliveryCount"] <= 10
    assert properties["lockDuration"].startswith("PT")


@pytest.mark.parametrize("symbol", sorted(QUEUE_SYMBOLS))
def test_queue_properties_equal_servicebus_config(symbol: str) -> None:
    name, properties = _queue(symbol)
    expected = _config_queues()[name]
    actual = {key: properties.get(CONFIG_TO_BICEP[key]) for key in expected}
    assert actual == expected


def test_each_apps_queues_are_the_ones_the_code_names() -> None:
    # inboundQueueNames and statusQueueNames loop over submittingApps, as orderflow/apps.py names an app's queues; the
    # default app is SubmittingApps' default, and the legacy app (legacyOrdersApp's default) LegacyOrdersApp's.
    default_apps = evaluate(main().params["submittingApps"], Scope(main()))
    names = [a["name"] for a in default_apps]
    assert ",".join(names) == settings.get("SubmittingApps", env={})
    assert evaluate(main().params["legacyOrdersApp"], Scope(main(), functions=frozenset({"for"}))) == names[0]
    assert names[0] == settings.get("LegacyOrdersApp", env={})
    for variable, expected in (("inboundQueueNames", apps.inbound_queue), ("statusQueueNames", apps.status_queue)):
        loop = main().variables[variable]
        assert loop.type == "for_statement"
        assert evaluate(loop, Scope(main(), functions=frozenset({"for"}))) == [expected(n) for n in names], variable


@pytest.mark.parametrize(("symbol", "like"), [("inboundQueues", "ordersQueue"), ("statusQueues", None)])
def test_per_app_queue_properties_equal_config(symbol: str, like: str | None) -> None:
    scope = _scope()
    queue = scope.file.resource(symbol)
    assert queue.loop and queue.type == "Microsoft.ServiceBus/namespaces/queues"
    properties = evaluate(queue.get("properties"), scope)
    default_app = settings.get("SubmittingApps", env={}).split(",")[0]
    name = apps.inbound_queue(default_app) if symbol == "inboundQueues" else apps.status_queue(default_app)
    expected = _config_queues()[name]
    assert {key: properties.get(CONFIG_TO_BICEP[key]) for key in expected} == expected
    assert properties["requiresSession"] is True  # SubmitOrder and StatusMessage: SessionId = orderId
    if like is not None:  # an app's own inbound queue is orders-inbound's twin: the same message arrives on either
        assert properties == _queue(like)[1]


def test_the_local_brokers_queues_are_the_ones_main_bicep_creates_for_the_local_apps() -> None:
    """servicebus.config.json holds exactly the queues main.bicep's Service Bus module creates for the local system
    (the rights' local deployment: main.parameters.json's apps, then the local-only ones such as `partner`), each with
    the properties Bicep gives it."""
    scope = module_scope(local_deployment(REPO / "infra"), main().module("serviceBus"))
    created: dict[str, dict[str, Any]] = {}
    for queue in scope.file.resources_of("Microsoft.ServiceBus/namespaces/queues"):
        if queue.loop:
            for name in evaluate(loop_parts(queue.value)[2], scope):
                created[name] = evaluate(queue.get("properties"), scope)
        else:
            created[evaluate(queue.get("name"), scope)] = evaluate(queue.get("properties"), scope)
    config = _config_queues()
    assert set(config) == set(created)
    for name, expected in config.items():
        assert {key: created[name].get(CONFIG_TO_BICEP[key]) for key in expected} == expected, name
    assert {"app-orders", "app-status", "partner-orders", "partner-status", "orders-inbound"} <= set(config)


def test_agent_requests_max_delivery_count_is_the_budget_setting() -> None:
    # Issue 11, the retry budget: a redelivered Agent request (after an Agent crash) calls the remote service again,
    # so the budget arithmetic multiplies by AgentRequestsMaxDeliveryCount; it must be the queue's real property, in
    # Azure (servicebus.bicep) and locally (servicebus.config.json, the embedded broker).
    expected = int(settings.get("AgentRequestsMaxDeliveryCount", env={}) or "0")
    name, properties = _queue("agentRequestsQueue")
    assert properties["maxDeliveryCount"] == expected
    assert _config_queues()[name]["MaxDeliveryCount"] == expected
    # The function app gets the same value as a setting (function.bicep codeSettings).
    function = app("function.bicep")
    settings_ = evaluate(function.variables["codeSettings"], Scope(function))
    assert settings_["AgentRequestsMaxDeliveryCount"] == str(properties["maxDeliveryCount"])


def test_a_submitting_apps_longest_name_is_the_codes_and_has_valid_queues() -> None:
    """types.bicep's @maxLength on an app's name is orderflow/apps.py's APP_NAME_MAX_LEN (the app refuses a longer
    SubmittingApps entry at start), and its status queue `<name>-status` then passes the reply-queue rule
    (orderflow.messages.valid_reply_to), so no order of the app is rejected for its replyTo."""
    import re

    from support.bicep_tree import text, type_declarations

    from orderflow.messages import valid_reply_to

    declared = text(type_declarations(app("types.bicep"))["submittingApp"])
    (max_name,) = (
        int(n) for n in re.findall(r"@maxLength\((\d+)\)\s*@description\('[^']*'\)\s*name: string", declared)
    )
    assert "'${app.name}-status'" in main().path.read_text()
    assert max_name == apps.APP_NAME_MAX_LEN
    apps.valid_app_name("a" * max_name)
    longest = "a" * max_name + "-status"
    assert valid_reply_to(longest) == longest
    with pytest.raises(ValueError):
        apps.valid_app_name("a" * (max_name + 1))
