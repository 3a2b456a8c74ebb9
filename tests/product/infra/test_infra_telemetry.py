"""The Agent's telemetry and scaling, and the rule that no alert watches a signal nothing emits.

- The Agent exports to Application Insights as the function app does: the connection string from monitoring.bicep,
  Entra ID ingestion (APPLICATIONINSIGHTS_AUTHENTICATION_STRING with its own client id) and Monitoring Metrics
  Publisher on the component. (agent/__main__.py calls configure_from_env: tests/product/agent/test_agent_telemetry.py.)
- Every alert rule queries only names the code emits: a metric alert's metricName is a platform metric of its
  namespace (an explicit allow-list below) or an OpenTelemetry instrument created in orderflow/ or agent/; a
  scheduled-query rule's customMetrics names are such instruments, its traces filters match a log line the code
  writes, and its requests names are registered functions.
- The circuit-open alert (issue 11) reads the breaker's state gauge `orderflow.circuit.state`, which the code
  creates, fires at 2 (open), per remote service.
- The Agent runs fixed replicas and has no azure-servicebus scale rule: KEDA's scaler needs the Manage right
  (Data Owner), which this design grants nobody, so such a rule could never add a replica.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from support.bicep_tree import (
    REPO,
    Opaque,
    Scope,
    all_files,
    app,
    evaluate,
    main,
    module_scope,
    object_get,
    string_parts,
    text,
)
from support.code_scan import PLATFORM_METRICS, emitted_metric_names, log_formats, registered_function_names
from tree_sitter import Node

from orderflow import function_names

# Application Insights tables a scheduled-query rule may read, and how the test checks each one's filters.
KNOWN_TABLES = ("customMetrics", "traces", "requests")
_ESCAPES = {"\\'": "'", "\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t", "\\$": "$"}


def interpolate(node: Node, scope: Scope) -> str:
    """A Bicep string with its ${...} resolved where the value is known; an unknown one stays as ${...}."""
    assert node.type == "string", text(node)

    def resolve(child: Node) -> str:
        value = evaluate(child.named_children[0], scope)
        return value if isinstance(value, str) else text(child)

    return str(string_parts(node, resolve))


def _alerts(type_name: str) -> Iterator[tuple[str, Node, Scope]]:
    for bicep in all_files():
        for alert in bicep.resources_of(type_name):
            all_of = alert.get("properties", "criteria", "allOf")
            assert all_of is not None and all_of.type == "array", f"{bicep.name}: {alert.symbol}"
            for criterion in all_of.named_children:
                if criterion.type == "object":
                    yield f"{bicep.name}: {alert.symbol}", criterion, Scope(bicep)


def _segments(query: str) -> list[tuple[str, str]]:
    """(table, the query text up to the next table) for every Application Insights table the query reads."""
    tables = r"\b(customMetrics|traces|requests|customEvents|dependencies|exceptions|pageViews|availabilityResults)\b"
    found = list(re.finditer(tables, query))
    return [
        (m.group(1), query[m.end() : found[i + 1].start() if i + 1 < len(found) else len(query)])
        for i, m in enumerate(found)
    ]


def _trace_matches(operator: str, needle: str, fmt: str) -> bool:
    """Whether a log line written with `fmt` can satisfy `message <operator> "<needle>"` (KQL, case-insensitive)."""
    if operator == "startswith":
        return fmt.lower().startswith(needle.lower())
    if operator == "has":  # a whole term (or sequence of terms)
        return re.search(rf"(?<![A-Za-z0-9]){re.escape(needle)}(?![A-Za-z0-9])", fmt, re.IGNORECASE) is not None
    assert operator == "contains", operator
    return needle.lower() in fmt.lower()


def test_the_code_emits_metrics_and_logs_the_scan_can_see() -> None:
    # A guard on the scanners themselves: if they found nothing, the tests below would pass vacuously.
    assert {"orderflow.orders.error", "orderflow.alerts"} <= emitted_metric_names()
    assert any(fmt.startswith("operator alert ") for fmt in log_formats())
    assert function_names.SUPERVISOR in registered_function_names()


def test_metric_alerts_watch_platform_metrics_or_emitted_ones() -> None:
    emitted = emitted_metric_names()
    checked = 0
    for where, criterion, scope in _alerts("Microsoft.Insights/metricAlerts"):
        namespace = evaluate(object_get(criterion, "metricNamespace"), scope)
        name = evaluate(object_get(criterion, "metricName"), scope)
        assert isinstance(namespace, str) and isinstance(name, str), f"{where}: name the namespace and metric"
        allowed = PLATFORM_METRICS.get(namespace, emitted)
        assert name in allowed, f"{where}: {namespace}/{name} is neither a listed platform metric nor emitted"
        checked += 1
    assert checked


def test_scheduled_query_rules_read_only_what_the_code_emits() -> None:
    emitted, formats, functions = emitted_metric_names(), log_formats(), registered_function_names()
    checked = 0
    for where, criterion, scope in _alerts("Microsoft.Insights/scheduledQueryRules"):
        query_node = object_get(criterion, "query")
        assert query_node is not None, where
        query = interpolate(query_node, scope)
        assert "${" not in query, f"{where}: unresolved {query}"
        segments = _segments(query)
        assert segments, f"{where}: reads no table: {query}"
        for table, segment in segments:
            assert table in KNOWN_TABLES, f"{where}: teach this test what {table} emits"
            if table == "customMetrics":
                names = re.findall(r'\bname\s*==\s*"([^"]+)"', segment)
                assert names, f"{where}: customMetrics without a name filter"
                assert set(names) <= emitted, f"{where}: nothing emits {set(names) - emitted}"
            elif table == "traces":
                filters = re.findall(r'\bmessage\s+(has|startswith|contains)\s+"([^"]+)"', segment)
                assert filters, f"{where}: traces without a message filter"
                for operator, needle in filters:
                    assert any(_trace_matches(operator, needle, fmt) for fmt in formats), (
                        f"{where}: no log line satisfies message {operator} {needle!r}"
                    )
            else:
                names = re.findall(r'\b(?:name|operation_Name)\s*==\s*"([^"]+)"', segment)
                assert names and set(names) <= functions, f"{where}: {names} are not registered functions"
            checked += 1
    assert checked


# The breaker's state gauge (design of issue 11; orderflow/telemetry.py set_circuit_state, with orderflow.breaker
# STATE_VALUES): 0 closed, 1 half-open, 2 open, one time series per remote service (attribute `service`).
CIRCUIT_STATE_METRIC = "orderflow.circuit.state"
CIRCUIT_OPEN = 2


def test_circuit_open_alert_watches_the_breaker_state_the_code_emits() -> None:
    assert CIRCUIT_STATE_METRIC in emitted_metric_names(), "the Agent must create the gauge the alert reads"
    from orderflow import breaker  # here, not at the top: the other telemetry checks do not need it

    assert breaker.STATE_VALUES[breaker.BreakerState.OPEN] == CIRCUIT_OPEN, "the value the alert fires on"
    assert sorted(breaker.STATE_VALUES.values()) == [0, 1, 2]
    alerts = app("alerts.bicep")
    scope = Scope(alerts)
    assert evaluate(alerts.variables["circuitStateMetric"], scope) == CIRCUIT_STATE_METRIC
    rule = alerts.resource("circuitOpen")
    assert rule.type == "Microsoft.Insights/scheduledQueryRules"
    properties = evaluate(rule.get("properties"), scope)
    assert properties["enabled"] is True and properties["severity"] <= 1
    assert isinstance(properties["actions"]["actionGroups"], Opaque)  # the same action group as the other rules
    assert text(rule.get("properties", "actions", "actionGroups")) == "actions"
    (criterion,) = rule.get("properties", "criteria", "allOf").named_children
    query = interpolate(object_get(criterion, "query"), scope)
    assert [table for table, _ in _segments(query)] == ["customMetrics"]
    assert re.search(rf'\bname\s*==\s*"{re.escape(CIRCUIT_STATE_METRIC)}"', query), query
    assert 'customDimensions["service"]' in query and "by service" in query  # one alert per remote service
    values = evaluate(criterion, scope)
    # Fires when the state reached 2 (open): >= 2, or > 1 (half-open, 1, must not fire).
    assert (values["operator"], values["threshold"]) in {
        ("GreaterThanOrEqual", CIRCUIT_OPEN),
        ("GreaterThan", CIRCUIT_OPEN - 1),
    }
    assert values["timeAggregation"] == "Maximum"
    assert values["metricMeasureColumn"] in re.findall(r"summarize\s+(\w+)\s*=", query)
    assert values["dimensions"] == [{"name": "service", "operator": "Include", "values": ["*"]}]
    section = _docs_section("Agent telemetry and scaling")
    assert "circuit-open" in section.lower() and CIRCUIT_STATE_METRIC in section
    assert "no circuit-open alert" not in section.lower().replace("**", "")
    assert CIRCUIT_STATE_METRIC in _docs_section("Alerts")


def _agent_env() -> dict[str, object]:
    scope = module_scope(Scope(main()), main().module("agent"))
    containers = scope.file.resource("agent").get("properties", "template", "containers")
    assert containers is not None
    (container,) = containers.named_children
    return {item["name"]: item["value"] for item in evaluate(container, scope)["env"]}


def test_agent_exports_telemetry_with_entra_id_like_the_function_app() -> None:
    env = _agent_env()
    connection = env["APPLICATIONINSIGHTS_CONNECTION_STRING"]
    assert isinstance(connection, Opaque)
    assert connection.text == "monitoring.outputs.applicationInsightsConnectionString"
    authentication = env["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]
    assert isinstance(authentication, Opaque)
    assert authentication.text == "'ClientId=${identityClientId};Authorization=AAD'"
    client_id = env["AZURE_CLIENT_ID"]
    assert isinstance(client_id, Opaque) and client_id.text == "identity.outputs.agentClientId"
    # The same authentication string as the function app's (function.bicep).
    function_settings = app("function.bicep").variables["hostSettings"]
    assert "'ClientId=${identityClientId};Authorization=AAD'" in text(function_settings)


def test_agent_identity_publishes_metrics_to_application_insights() -> None:
    rbac = app("rbac.bicep")
    publisher = evaluate(rbac.variables["roles"], Scope(rbac))["monitoringMetricsPublisher"]
    assert publisher == "3913510d-42f4-4e42-8a64-420c390055eb"  # Monitoring Metrics Publisher

    def source(node: Node | None) -> str:
        return text(node) if node is not None else ""

    grants = [
        r
        for r in rbac.resources_of("Microsoft.Authorization/roleAssignments")
        if source(r.get("properties", "principalId")) == "agentPrincipalId"
        and source(r.get("scope")) == "applicationInsights"
        and "roles.monitoringMetricsPublisher" in source(r.get("properties", "roleDefinitionId"))
    ]
    assert len(grants) == 1
    assert text(main().module("rbac").params()["agentPrincipalId"]) == "identity.outputs.agentPrincipalId"


def test_agent_runs_fixed_replicas_without_a_scale_rule_it_cannot_read() -> None:
    scope = module_scope(Scope(main()), main().module("agent"))
    scale = evaluate(scope.file.resource("agent").get("properties", "template", "scale"), scope)
    assert scale["minReplicas"] == scale["maxReplicas"] == 2, scale
    assert not scale.get("rules"), "no scale rule: nothing could read the queue length (docs/deploy.md)"
    # No container app anywhere scales on Service Bus: its scaler needs Data Owner, which nobody holds.
    for bicep in all_files():
        for container_app in bicep.resources_of("Microsoft.App/containerApps"):
            rules = container_app.get("properties", "template", "scale", "rules")
            assert rules is None or "azure-servicebus" not in text(rules), f"{bicep.name}: {container_app.symbol}"
    section = _docs_section("Agent telemetry and scaling")
    assert "agentReplicas" in section and "Data Owner" in section


def _docs_section(title: str) -> str:
    doc = Path(REPO / "docs" / "deploy.md").read_text()
    match = re.search(rf"^(#+) {re.escape(title)}\n(.*?)(?=^#{{1,3}} |\Z)", doc, re.MULTILINE | re.DOTALL)
    assert match, f"docs/deploy.md has no {title!r} section"
    return match.group(2)
