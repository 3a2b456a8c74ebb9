"""Cosmos DB containers and indexes (the code's query contract), the function app's Flex Consumption shape,
diagnostic settings, and the alert rules that mean an operator must act. (The Agent's scaling and telemetry:
test_infra_telemetry.py.)
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import UTC, datetime

import pytest
from support.bicep_tree import Opaque, Scope, all_files, app, evaluate, main, module_scope, text

from orderflow import outbound, settings
from orderflow.azure import cosmos
from orderflow.function_names import SUPERVISOR
from orderflow.messages import AlertKind


def _cosmos() -> Scope:
    return module_scope(Scope(main()), main().module("cosmos"))


def _container(symbol: str) -> dict:
    scope = _cosmos()
    return evaluate(scope.file.resource(symbol).get("properties", "resource"), scope)


@pytest.mark.parametrize(
    ("symbol", "setting", "path"),
    [
        ("ordersContainer", "OrdersContainerName", cosmos.ORDER_PARTITION_PATH),
        ("stateContainer", "StateContainerName", cosmos.ORDER_PARTITION_PATH),
        ("checkpointContainer", "CheckpointContainerName", cosmos.CHECKPOINT_PARTITION_PATH),
        # Issue 11: one document per remote service (id = RemoteServiceName), partition key /id like the checkpoints
        # (cosmos.ensure_containers creates it with CHECKPOINT_PARTITION_PATH for the emulator).
        ("circuitBreakerContainer", "CircuitBreakerContainerName", "/id"),
        # Issue 12: the recovery index, one partition per CompleteBy time bucket (test_infra_recovery_index.py).
        ("recoveryIndexContainer", "RecoveryIndexContainerName", "/bucket"),
    ],
)
def test_containers_and_partition_keys_match_the_adapter(symbol: str, setting: str, path: str) -> None:
    container = _container(symbol)
    assert container["id"] == settings.get(setting, env={})
    assert container["partitionKey"]["paths"] == [path]


def test_orders_container_indexes_only_fields_its_documents_have_and_its_queries_need() -> None:
    """The orders DB holds OrderRecord documents, read by id only: every indexed path is a field of such a document,
    and the partition key is the only one (no query filters or sorts on anything else)."""
    import inspect
    from datetime import UTC, datetime

    from orderflow.messages import SubmitOrder
    from orderflow.records import OrderRecord

    order = SubmitOrder.model_validate(
        {
            "orderId": "o-1",
            "replyTo": "app-status",
            "customer": {"id": "c-1", "name": "Ada"},
            "items": [{"sku": "sku-1", "quantity": 1, "unitPrice": "1.00"}],
            "currency": "EUR",
            "submittedAt": "2026-01-01T00:00:00+00:00",
        }
    )
    doc = OrderRecord.from_order(order, datetime(2026, 1, 1, tzinfo=UTC)).to_doc()
    policy = _container("ordersContainer")["indexingPolicy"]
    paths = [p["path"] for p in policy["includedPaths"]]
    for path in paths:
        node: object = doc
        for part in path.removesuffix("/?").strip("/").split("/"):
            assert isinstance(node, dict) and part in node, f"{path}: the orders documents have no such field"
            node = node[part]
    assert paths == [cosmos.ORDER_PARTITION_PATH + "/?"]
    assert policy["excludedPaths"] == [{"path": "/*"}]
    assert "query_items" not in inspect.getsource(cosmos.CosmosOrdersDb)


def test_databases() -> None:
    scope = _cosmos()
    names = {
        evaluate(r.get("name"), scope)
        for r in scope.file.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlDatabases")
    }
    assert names == {settings.get("OrdersDatabaseName", env={}), settings.get("StateDatabaseName", env={})}


def test_state_indexes_serve_the_starter_and_the_supervisor() -> None:
    composites = [
        [(p["path"], p["order"]) for p in index]
        for index in _container("stateContainer")["indexingPolicy"]["compositeIndexes"]
    ]
    for required in cosmos.STATE_INDEXING_POLICY["compositeIndexes"]:  # the adapter's ORDER BY needs these
        assert [(p["path"], p["order"]) for p in required] in composites
    assert [("/processState", "ascending"), ("/completeBy", "ascending")] in composites  # Supervisor
    assert any(c[:2] == [("/processState", "ascending"), ("/retryAt", "ascending")] for c in composites)  # Starter


def test_cosmos_capacity_is_a_parameter() -> None:
    account = app("cosmos.bicep").resource("account")
    assert "capacityMode == 'serverless'" in text(account.get("properties", "capabilities"))
    assert "autoscaleSettings" in text(app("cosmos.bicep").variables["databaseOptions"])
    assert main().module("cosmos").params()["capacityMode"].text.decode() == "cosmosCapacityMode"


def test_function_app_is_flex_consumption_python_311_with_scale_parameters() -> None:
    scope = module_scope(Scope(main()), main().module("functionApp"))
    plan = evaluate(scope.file.resource("plan").get("sku"), scope)
    assert plan == {"name": "FC1", "tier": "FlexConsumption"}
    config = evaluate(scope.file.resource("functionApp").get("properties", "functionAppConfig"), scope)
    assert config["runtime"] == {"name": "python", "version": "3.11"}
    assert config["scaleAndConcurrency"]["maximumInstanceCount"] == 100
    assert config["scaleAndConcurrency"]["alwaysReady"] == []
    assert config["deployment"]["storage"]["authentication"]["type"] == "UserAssignedIdentity"
    assert {"functionMaximumInstanceCount", "functionAlwaysReady"} <= set(main().params)


@pytest.mark.parametrize(
    ("file", "target"),
    [
        ("servicebus.bicep", "namespace"),
        ("cosmos.bicep", "account"),
        ("function.bicep", "functionApp"),
        ("agent.bicep", "environment"),
    ],
)
def test_diagnostic_settings_send_to_log_analytics(file: str, target: str) -> None:
    bicep = app(file)
    settings_ = [
        d for d in bicep.resources_of("Microsoft.Insights/diagnosticSettings") if text(d.get("scope")) == target
    ]
    assert len(settings_) == 1
    assert text(settings_[0].get("properties", "workspaceId")) == "logAnalyticsWorkspaceId"
    assert evaluate(settings_[0].get("properties", "logs"), Scope(bicep))


def test_application_insights_uses_entra_id_ingestion() -> None:
    component = app("monitoring.bicep").resource("applicationInsights")
    properties = evaluate(component.get("properties"), Scope(component.file))
    assert properties["DisableLocalAuth"] is True
    assert isinstance(properties["WorkspaceResourceId"], Opaque)


def _alert(symbol: str) -> dict:
    alerts = app("alerts.bicep")
    return evaluate(alerts.resource(symbol).get("properties"), Scope(alerts))


def _dead_letter_alert(symbol: str) -> tuple[dict, dict]:
    """(properties, the one criterion) of a dead-letter metric alert, as main.bicep invokes alerts.bicep."""
    alerts = app("alerts.bicep")
    scope = module_scope(Scope(main()), main().module("alerts"))
    properties = evaluate(alerts.resource(symbol).get("properties"), scope)
    (criterion,) = properties["criteria"]["allOf"]
    assert criterion["metricName"] == "DeadletteredMessages" and criterion["operator"] == "GreaterThan"
    return properties, criterion


def _queues_of(criterion: dict) -> set[str]:
    (dimension,) = criterion["dimensions"]
    assert dimension["name"] == "EntityName" and dimension["operator"] == "Include"
    assert isinstance(dimension["values"], list), dimension["values"]
    return set(dimension["values"])


def test_dead_letter_alerts_cover_every_queue_and_no_sender_pages() -> None:
    # Every queue of the namespace is watched by exactly one dead-letter alert. Dead letters on a queue a sender
    # fills or drains (poison input on orders-inbound, an app that never reads its status queue) count towards a
    # Sev-3 threshold; only the product writes the system queues, so a dead letter there is Sev-2. Sev-1 is the
    # orders-in-Error alert alone (issue 21: anybody who can submit could page the operators).
    names = {
        key: evaluate(main().module("serviceBus").params()[key], Scope(main()))
        for key in ("ordersQueueName", "agentRequestsQueueName", "agentRepliesQueueName", "operatorAlertsQueueName")
    }
    system, system_criterion = _dead_letter_alert("deadLetters")
    sender, sender_criterion = _dead_letter_alert("senderDeadLetters")
    assert _queues_of(system_criterion) == {
        names["agentRequestsQueueName"],
        names["agentRepliesQueueName"],
        names["operatorAlertsQueueName"],
    }
    # Each app's inbound and status queues are deployment-time lists (one per submitting app): the sender alert takes
    # the very lists the namespace creates them from, after orders-inbound.
    bus_inbound, bus_status, alert_queues = (
        text(main().module(m).params()[k])
        for m, k in (
            ("serviceBus", "inboundQueueNames"),
            ("serviceBus", "statusQueueNames"),
            ("alerts", "senderQueueNames"),
        )
    )
    assert (bus_inbound, bus_status) == ("inboundQueueNames", "statusQueueNames")
    assert alert_queues == "concat([ordersQueueName], inboundQueueNames, statusQueueNames)"
    assert text(main().module("serviceBus").params()["ordersQueueName"]) == "ordersQueueName"
    assert system["severity"] == 2 and system_criterion["threshold"] == 0
    assert sender["severity"] == 3 and sender_criterion["threshold"] == 20  # badInputThreshold's default
    assert sender["windowSize"] == "PT15M" and system["windowSize"] == "PT5M"


def test_severity_1_is_kept_for_what_no_sender_can_cause() -> None:
    # What pages: an order ended failed, the remote service is cut off (the breaker is open: every order waits), or
    # the Supervisor stopped running. No sender's input causes these; every alert a sender can cause is Sev-2 or lower.
    alerts = app("alerts.bicep")
    scope = module_scope(Scope(main()), main().module("alerts"))
    severities = {
        r.symbol: evaluate(r.get("properties", "severity"), scope)
        for r in alerts.resources
        if r.type.startswith("Microsoft.Insights/") and r.get("properties", "severity") is not None
    }
    paging = sorted(symbol for symbol, level in severities.items() if level == 1)
    assert paging == ["circuitOpen", "ordersInError", "supervisorSilent"]
    assert severities["badInput"] == 2 and severities["deadLetters"] == 2 and severities["senderDeadLetters"] == 3


def test_orders_in_error_alert_reads_the_metric_and_the_alert_log() -> None:
    alerts = app("alerts.bicep")
    assert evaluate(alerts.variables["ordersErrorMetric"], Scope(alerts)) == "orderflow.orders.error"
    (criterion,) = alerts.resource("ordersInError").get("properties", "criteria", "allOf").named_children
    query = text(criterion)
    assert "${ordersErrorMetric}" in query and "${operatorAlertLogPrefix}" in query
    assert evaluate(alerts.variables["operatorAlertLogPrefix"], Scope(alerts)) == "operator alert "


# Every operator alert kind, by what it means: an order that ended failed (Sev-1, pages), bad input a sender can send
# at will (Sev-2 over a rate), a breaker transition (the circuit-open alert reads the breaker's gauge instead).
ORDER_FAILURE_KINDS = {AlertKind.FAILURE_THRESHOLD, AlertKind.ORDER_FAILED, AlertKind.COMPENSATION_FAILED}
INPUT_KINDS = {AlertKind.POISON_MESSAGE, AlertKind.ORDER_CONFLICT}
BREAKER_KINDS = {AlertKind.CIRCUIT_OPENED, AlertKind.CIRCUIT_CLOSED}


def _kind_filter(symbol: str) -> set[str]:
    """The alert kinds a rule's traces half matches: `customDimensions["alert_kind"]) in (<list>)`."""
    alerts = app("alerts.bicep")
    (criterion,) = alerts.resource(symbol).get("properties", "criteria", "allOf").named_children
    (variable,) = re.findall(r'customDimensions\["alert_kind"\]\) in \(\$\{(\w+)\}\)', text(criterion))
    return set(re.findall(r'"([^"]+)"', evaluate(alerts.variables[variable], Scope(alerts))))


def test_every_alert_kind_has_one_meaning() -> None:
    assert ORDER_FAILURE_KINDS | INPUT_KINDS | BREAKER_KINDS == set(AlertKind)
    assert len(ORDER_FAILURE_KINDS) + len(INPUT_KINDS) + len(BREAKER_KINDS) == len(AlertKind)


def test_the_sev1_alert_pages_on_orders_that_ended_failed_only() -> None:
    assert _alert("ordersInError")["severity"] == 1
    assert _kind_filter("ordersInError") == {k.value for k in ORDER_FAILURE_KINDS}


def test_bad_input_has_its_own_lower_severity_rate_alert() -> None:
    rule = _alert("badInput")
    assert rule["severity"] == 2 and rule["enabled"] is True
    assert _kind_filter("badInput") == {k.value for k in INPUT_KINDS}
    (criterion,) = rule["criteria"]["allOf"]
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 20)
    assert criterion["timeAggregation"] == "Total" and criterion["metricMeasureColumn"] == "bad"
    assert rule["evaluationFrequency"] == "PT5M"
    alerts = app("alerts.bicep")
    assert evaluate(alerts.params["badInputWindowMinutes"], Scope(alerts)) == 15
    assert text(alerts.resource("badInput").get("properties", "windowSize")) == "'PT${badInputWindowMinutes}M'"
    assert "summarize bad = count()" in text(alerts.resource("badInput").get("properties", "criteria"))


def test_the_alert_log_line_carries_the_kind_the_rules_filter_on(caplog: pytest.LogCaptureFixture) -> None:
    """raise_alert's ERROR line has the attribute `alert_kind`; the OpenTelemetry log handler turns a record's extra
    attributes into log attributes (opentelemetry-sdk LoggingHandler._get_attributes), which the Azure Monitor
    exporter writes as customDimensions (azure-monitor-opentelemetry-exporter export/logs/_exporter.py)."""
    sent: list[object] = []

    class Sender:
        async def __aenter__(self) -> Sender:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def send_messages(self, message: object) -> None:
            sent.append(message)

    class Bus:
        def get_queue_sender(self, queue: str) -> Sender:
            return Sender()

    with caplog.at_level(logging.ERROR, logger="orderflow.outbound"):
        asyncio.run(
            outbound.raise_alert(
                Bus(),
                "operator-alerts",
                kind=AlertKind.POISON_MESSAGE,
                order_id=None,
                reason="bad json",
                now=datetime(2026, 1, 1, tzinfo=UTC),
            )
        )
    (record,) = [r for r in caplog.records if r.getMessage().startswith("operator alert ")]
    assert record.alert_kind == "PoisonMessage"  # type: ignore[attr-defined]
    assert len(sent) == 1  # and the alert still goes to the operator-alerts queue


def test_supervisor_silence_alert() -> None:
    alerts = app("alerts.bicep")
    assert evaluate(alerts.variables["supervisorFunctionName"], Scope(alerts)) == SUPERVISOR
    (criterion,) = evaluate(alerts.resource("supervisorSilent").get("properties", "criteria", "allOf"), Scope(alerts))
    assert criterion["operator"] == "LessThan" and criterion["threshold"] == 1
    assert "supervisorSilenceMinutes" in text(alerts.resource("supervisorSilent").get("properties", "windowSize"))


def test_every_alert_is_enabled() -> None:
    for bicep in all_files():
        for alert in bicep.resources_of("Microsoft.Insights/metricAlerts") + bicep.resources_of(
            "Microsoft.Insights/scheduledQueryRules"
        ):
            assert evaluate(alert.get("properties", "enabled"), Scope(bicep)) is True
