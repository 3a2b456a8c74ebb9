"""Service Bus in Bicep: Standard tier, the pattern's queue properties, equal to servicebus.config.json (what
the embedded broker runs locally), and one status queue per submitting application.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.bicep_tree import REPO, Scope, app, evaluate, main, module_scope

from orderflow import settings

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


def test_default_status_queue_is_allowed_reply_queue() -> None:
    # statusQueueNames = [for app in submittingApps: '${app.name}-status'] with the default app named 'app'.
    apps = evaluate(main().params["submittingApps"], Scope(main()))
    assert [f"{a['name']}-status" for a in apps] == settings.get("AllowedReplyQueues", env={}).split(",")
    loop = main().variables["statusQueueNames"]
    assert loop.type == "for_statement" and "'${app.name}-status'" in loop.text.decode()


def test_status_queue_properties_equal_config() -> None:
    scope = _scope()
    status = scope.file.resource("statusQueues")
    assert status.loop and status.type == "Microsoft.ServiceBus/namespaces/queues"
    properties = evaluate(status.get("properties"), scope)
    expected = _config_queues()[settings.get("AllowedReplyQueues", env={}).split(",")[0]]
    assert {key: properties.get(CONFIG_TO_BICEP[key]) for key in expected} == expected
    assert properties["requiresSession"] is True  # StatusMessage: SessionId = orderId


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


def test_a_submitting_apps_longest_name_still_has_a_valid_status_queue() -> None:
    """main.bicep names each app's status queue `<name>-status` and lists it in AllowedReplyQueues; an order's
    replyTo must pass the reply-queue rule (orderflow.messages.valid_reply_to), so a longer name would get every
    order rejected. types.bicep's @maxLength on the name is that rule's length minus the suffix."""
    import re

    from support.bicep_tree import text, type_declarations

    from orderflow.messages import valid_reply_to

    declared = text(type_declarations(app("types.bicep"))["submittingApp"])
    (max_name,) = (
        int(n) for n in re.findall(r"@maxLength\((\d+)\)\s*@description\('[^']*'\)\s*name: string", declared)
    )
    assert "'${app.name}-status'" in main().path.read_text()
    longest = "a" * max_name + "-status"
    assert valid_reply_to(longest) == longest
    with pytest.raises(ValueError):
        valid_reply_to("a" * (max_name + 1) + "-status")
