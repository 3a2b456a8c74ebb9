"""The operations workbook (issue 14, part 4): infra/app/workbook.bicep deploys infra/app/workbook.json.

- main.bicep deploys it with the Application Insights component's id (its sourceId, and what every KQL tile queries)
  and the Service Bus namespace's id, and outputs its portal link and resource id; its name is a GUID.
- The JSON is a workbook ("Notebook/1.0") whose tiles show every figure of `orderflow summary` (or say, in a text
  tile, that they cannot): orders per state, expired Processing, dead-letter depth per queue, breaker per remote
  service, the Supervisor's last run and scan cost, throughput, latency and operator alerts.
- Each KQL tile reads only tables that exist for the component's mode as monitoring.bicep deploys it, and only names
  the code emits (the rule tests/product/infra/test_infra_telemetry.py applies to the alert rules).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.bicep_tree import (
    INFRA,
    REPO,
    Scope,
    app,
    code_children,
    evaluate,
    main,
    object_get,
    parse,
    string_value,
    syntax_errors,
    text,
)
from support.code_scan import PLATFORM_METRICS, emitted_metric_names, log_formats, registered_function_names
from support.infra_rules import FORBIDDEN
from tree_sitter import Node

WORKBOOK_BICEP = INFRA / "app" / "workbook.bicep"
WORKBOOK_JSON = INFRA / "app" / "workbook.json"
APP_INSIGHTS_ID = "__APPLICATION_INSIGHTS_ID__"
SERVICE_BUS_ID = "__SERVICE_BUS_NAMESPACE_ID__"
# Which workbook.bicep parameter replaces each placeholder, and what main.bicep passes for that parameter.
PLACEHOLDERS = {APP_INSIGHTS_ID: "applicationInsightsId", SERVICE_BUS_ID: "serviceBusNamespaceId"}
MAIN_PASSES = {
    "applicationInsightsId": "monitoring.outputs.applicationInsightsId",
    "serviceBusNamespaceId": "serviceBus.outputs.namespaceId",
}
OUTPUTS = {
    "OPERATIONS_WORKBOOK_URL": "workbook.outputs.workbookUrl",
    "OPERATIONS_WORKBOOK_ID": "workbook.outputs.workbookId",
}

# Application Insights tables under their two names (MicrosoftDocs azure-docs articles/azure-monitor/app/apm-tables.md,
# "Table structure": legacy name -> workspace name). A query against the component uses the legacy (classic) names,
# which keep working for a workspace-based component; a query in the Log Analytics workspace needs the App* names;
# a classic (non-workspace) component has no workspace, so no App* table.
CLASSIC_TABLES = {
    "availabilityResults",
    "browserTimings",
    "dependencies",
    "customEvents",
    "customMetrics",
    "pageViews",
    "performanceCounters",
    "requests",
    "exceptions",
    "traces",
}
WORKSPACE_TABLES = {
    "AppAvailabilityResults",
    "AppBrowserTimings",
    "AppDependencies",
    "AppEvents",
    "AppMetrics",
    "AppPageViews",
    "AppPerformanceCounters",
    "AppRequests",
    "AppExceptions",
    "AppTraces",
}
COMPONENTS = "microsoft.insights/components"
WORKSPACES = "microsoft.operationalinsights/workspaces"

# Issue 14's telemetry contract (/tmp/h/issue14.md, shared by every part): each metric the workbook reads and the
# attributes it may group by.
METRIC_ATTRIBUTES = {
    "orderflow.orders.in_state": {"state"},
    "orderflow.orders.completed": {"state"},
    "orderflow.order.duration": {"state"},
    "orderflow.circuit.state": {"service"},
    "orderflow.supervisor.request_charge": set(),
}
ALERT_EVENT = "OrderflowAlert"
ALERT_ATTRIBUTES = {"kind", "orderId", "reason"}
SUPERVISOR_SCAN_LINE = "supervisor scan ("


# ---------------------------------------------------------------- reading the workbook


def _notebook() -> dict[str, Any]:
    return json.loads(WORKBOOK_JSON.read_text())


def _items(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every item, groups (type 12) opened."""
    for item in items:
        yield item
        if item.get("type") == 12:
            yield from _items(item["content"].get("items", []))


def _of_type(kind: int, notebook: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [i for i in _items((notebook or _notebook())["items"]) if i["type"] == kind]


def _queries(notebook: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(item name, KQL) of every query tile."""
    return [(i["name"], i["content"]["query"]) for i in _of_type(3, notebook)]


def _all_kql(notebook: dict[str, Any] | None = None) -> str:
    return "\n".join(q for _, q in _queries(notebook))


def _text(notebook: dict[str, Any] | None = None) -> str:
    return "\n".join(i["content"]["json"] for i in _of_type(1, notebook))


def _sources(query: str) -> list[str]:
    """The tables a query reads: the first name of each statement (`let x = ...` bindings excluded)."""
    assert not re.search(r"\b(union|join|lookup)\b", query), "teach _sources to read union/join/lookup"
    bound: set[str] = set()
    found: list[str] = []
    for statement in filter(None, (s.strip() for s in query.split(";"))):
        let = re.match(r"let\s+(\w+)\s*=\s*(.*)", statement, re.DOTALL)
        if let:
            bound.add(let.group(1))
            statement = let.group(2).strip()
        first = re.match(r"[A-Za-z_]\w*", statement)
        assert first, f"no table at the start of {statement!r}"
        if first.group(0) not in bound:
            found.append(first.group(0))
    return found


def _names(query: str, column: str = "name") -> set[str]:
    return set(re.findall(rf'\b{column}\s*==\s*"([^"]+)"', query))


def _dimensions(query: str) -> set[str]:
    return set(re.findall(r'customDimensions\["([^"]+)"\]', query))


def _deployed_component_mode() -> str:
    """'workspace-based' when monitoring.bicep gives the component a Log Analytics workspace, else 'classic'."""
    component = app("monitoring.bicep").resource("applicationInsights")
    return "workspace-based" if component.get("properties", "WorkspaceResourceId") is not None else "classic"


# ---------------------------------------------------------------- the Bicep


def _workbook_resource():
    (workbook,) = app("workbook.bicep").resources_of("Microsoft.Insights/workbooks")
    return workbook


def _replacements(node: Node) -> tuple[Node, dict[str, str]]:
    """Unwind nested replace(x, 'literal', param) calls: (innermost x, {literal: param name})."""
    found: dict[str, str] = {}
    while node.type == "call_expression" and text(node.named_children[0]) == "replace":
        target, old, new = code_children(node.named_children[-1])
        literal = string_value(old)
        assert literal is not None, text(old)
        found[literal] = text(new)
        node = target
    return node, found


def test_the_module_parses_and_declares_one_shared_workbook() -> None:
    assert syntax_errors(parse(WORKBOOK_BICEP.read_bytes())) == []
    workbook = _workbook_resource()
    assert not workbook.existing and not workbook.loop and workbook.condition is None
    values = evaluate(workbook.body, Scope(workbook.file))
    assert values["kind"] == "shared"
    assert values["properties"]["category"] == "workbook"
    assert values["properties"]["version"] == "Notebook/1.0"
    assert text(workbook.get("name")) == "workbookName"
    assert text(workbook.get("properties", "sourceId")) == "applicationInsightsId"
    assert text(workbook.get("tags")) == "tags" and text(workbook.get("location")) == "location"


def test_the_serialized_data_is_the_json_with_every_placeholder_replaced() -> None:
    bicep = app("workbook.bicep")
    assert text(_workbook_resource().get("properties", "serializedData")) == "serializedData"
    inner, replaced = _replacements(bicep.variables["serializedData"])
    assert text(inner) == "definition"
    assert text(bicep.variables["definition"]) == "loadTextContent('workbook.json')"
    source = WORKBOOK_JSON.read_text()
    assert set(re.findall(r"__[A-Z_]+__", source)) == set(replaced) == set(PLACEHOLDERS)
    assert replaced == PLACEHOLDERS
    # Still JSON once the ids are in (they need no escaping), and the ids land where the tiles read them.
    ids = {
        APP_INSIGHTS_ID: "/subscriptions/s/resourceGroups/g/providers/Microsoft.Insights/components/appi-x",
        SERVICE_BUS_ID: "/subscriptions/s/resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/sb-x",
    }
    for placeholder, value in ids.items():
        source = source.replace(placeholder, value)
    notebook = json.loads(source)
    assert {r for i in _of_type(3, notebook) for r in i["content"]["crossComponentResources"]} == {ids[APP_INSIGHTS_ID]}
    assert {r for i in _of_type(10, notebook) for r in i["content"]["resourceIds"]} == {ids[SERVICE_BUS_ID]}


def test_main_deploys_the_workbook_with_the_application_insights_id() -> None:
    module = main().module("workbook")
    assert module.source == "app/workbook.bicep" and module.condition is None
    assert text(object_get(module.body, "scope")) == "rg", "in the resource group, next to the component"
    params = module.params()
    for name, passed in MAIN_PASSES.items():
        assert text(params[name]) == passed, name
    assert text(params["tags"]) == "tags" and text(params["location"]) == "location"
    assert text(params["displayName"]) == "workbookDisplayName" and "workbookDisplayName" in main().params
    target = module.target()
    assert target is not None and set(params) == set(target.params), "every workbook.bicep parameter is passed"


def test_the_workbook_name_is_an_overridable_guid() -> None:
    name = main().module("workbook").params()["workbookName"]
    assert name.type == "ternary_expression", "overridable like every other name"
    condition, when_set, generated = code_children(name)
    assert text(condition) == "!empty(workbookName)" and text(when_set) == "workbookName"
    assert text(generated).startswith("guid("), "a workbook's resource name must be a GUID"
    default = main().params["workbookName"]
    assert default is not None and text(default) == "''"


def test_main_outputs_the_workbook_link_and_id() -> None:
    outputs = main().outputs
    for name, value in OUTPUTS.items():
        assert name in outputs, f"main.bicep has no output {name}"
        assert text(outputs[name]) == value
    module_outputs = app("workbook.bicep").outputs
    assert text(module_outputs["workbookId"]) == "workbook.id"
    url = text(module_outputs["workbookUrl"])
    # The portal deep link of a shared workbook (see workbook.bicep): portal, Workbooks blade, the source component,
    # the workbook's id.
    assert url.startswith("'${environment().portal}/#view/AppInsightsExtension/UsageNotebookBlade/"), url
    assert "/ComponentId/${uriComponent(applicationInsightsId)}/" in url
    assert "/ConfigurationId/${uriComponent(workbook.id)}/" in url


def test_the_json_is_a_notebook_of_known_items() -> None:
    notebook = _notebook()
    assert notebook["version"] == "Notebook/1.0"
    assert notebook["fallbackResourceIds"] == [APP_INSIGHTS_ID]
    items = list(_items(notebook["items"]))
    assert items and {i["type"] for i in items} <= {1, 3, 9, 10, 12}, "text, query, parameters, metrics, group"
    names = [i["name"] for i in items]
    assert len(names) == len(set(names)), "item names are unique"
    for item in _of_type(3, notebook):
        content = item["content"]
        assert content["version"] == "KqlItem/1.0" and content["queryType"] == 0, item["name"]
        assert content["timeContextFromParameter"] == "TimeRange", item["name"]
    (parameters,) = _of_type(9, notebook)
    assert [p["name"] for p in parameters["content"]["parameters"]] == ["TimeRange"]
    for item in _of_type(10, notebook):
        assert item["content"]["version"] == "MetricsItem/2.0", item["name"]


def test_the_tiles_show_every_figure_of_the_summary() -> None:
    notebook = _notebook()
    queries = dict(_queries(notebook))
    by_metric = {name: q for q in queries.values() for name in _names(q) if name.startswith("orderflow.")}
    missing = set(METRIC_ATTRIBUTES) - set(by_metric)
    assert not missing, f"no tile reads {missing}"
    # Orders per state, breaker per remote service: the last value per attribute.
    assert (
        "by state" in by_metric["orderflow.orders.in_state"]
        and "arg_max(timestamp" in by_metric["orderflow.orders.in_state"]
    )
    assert "by service" in by_metric["orderflow.circuit.state"]
    # Throughput: orders completed per minute by terminal state.
    assert re.search(r"bin\(timestamp,\s*1m\),\s*state", by_metric["orderflow.orders.completed"])
    # Latency: p50/p95/p99 per terminal state.
    assert re.search(r"percentilesw?\([^)]*\b50,\s*95,\s*99\)", by_metric["orderflow.order.duration"])
    # The Supervisor: its last run (the function's executions and its scan line, with the expired count and RU) and
    # the scan cost metric.
    assert any(_sources(q) == ["requests"] and _names(q) == {"supervisor"} for q in queries.values())
    scans = [q for q in queries.values() if _sources(q) == ["traces"] and SUPERVISOR_SCAN_LINE in q]
    assert len(scans) == 1 and " expired:long " in scans[0] and " requestCharge:real " in scans[0]
    # Dead-letter depth per queue: the namespace's platform metric, one series per queue.
    dead_letters = [
        m
        for i in _of_type(10, notebook)
        for m in i["content"]["metrics"]
        if m["metric"].endswith("--DeadletteredMessages")
    ]
    assert dead_letters and all(m["splitBy"] == "EntityName" for m in dead_letters)
    # Operator alerts: the OrderflowAlert events with their kind, order and reason.
    alerts = [q for q in queries.values() if _sources(q) == ["customEvents"]]
    assert alerts and all(_names(q) == {ALERT_EVENT} for q in alerts)
    assert set().union(*(_dimensions(q) for q in alerts)) == ALERT_ATTRIBUTES
    # What the telemetry cannot show is said, not left out silently.
    words = _text(notebook).lower()
    assert "oldest pending" in words and "orderflow summary" in words and "approximate" in words


def test_queries_read_only_tables_of_the_deployed_component_mode() -> None:
    mode = _deployed_component_mode()
    assert mode == "workspace-based", "monitoring.bicep deploys a workspace-based component"
    allowed = {COMPONENTS: CLASSIC_TABLES, WORKSPACES: WORKSPACE_TABLES if mode == "workspace-based" else set()}
    checked = 0
    for item in _of_type(3):
        content = item["content"]
        target = content["resourceType"]
        assert target in allowed, f"{item['name']}: teach this test the tables of {target}"
        if target == COMPONENTS:
            assert content["crossComponentResources"] == [APP_INSIGHTS_ID], item["name"]
        sources = _sources(content["query"])
        assert sources and set(sources) <= allowed[target], f"{item['name']}: {sources} on {target} ({mode})"
        checked += 1
    assert checked


def test_the_table_check_rejects_a_workspace_table_on_the_component() -> None:
    # The check above must be able to fail: AppMetrics is the workspace's name, not the component's.
    assert _sources('AppMetrics | where Name == "x"') == ["AppMetrics"]
    assert "AppMetrics" not in CLASSIC_TABLES
    assert _sources("let t = customMetrics | take 1;\nt | count") == ["customMetrics"]


def test_queries_read_only_what_the_code_emits() -> None:
    emitted, formats, functions = emitted_metric_names(), log_formats(), registered_function_names()
    code = "\n".join(p.read_text() for d in ("orderflow", "agent") for p in sorted((REPO / d).rglob("*.py")))
    for name, query in _queries():
        (table,) = set(_sources(query))
        if table == "customMetrics":
            names = _names(query)
            assert names, f"{name}: customMetrics without a name filter"
            assert names <= emitted, f"{name}: nothing in orderflow/ or agent/ creates {names - emitted}"
            for metric in names:
                assert _dimensions(query) <= METRIC_ATTRIBUTES[metric], f"{name}: {metric} has no such attribute"
        elif table == "traces":
            (needle,) = re.findall(r'\bmessage\s+startswith\s+"([^"]+)"', query)
            lines = [f for f in formats if f.startswith(needle)]
            assert lines, f"{name}: no log line starts with {needle!r}"
            # The parse pattern reads the line the code writes: its literals and typed columns, in order, are the
            # format string's text and placeholders.
            pattern = re.search(r"parse\s+message\s+with\s+(.*?)(?:\n|$)", query)
            if pattern:
                regex = _format_regex(pattern.group(1))
                assert any(re.match(regex, line, re.DOTALL) for line in lines), f"{name}: {regex} vs {lines}"
        elif table == "requests":
            names = _names(query) | _names(query, "operation_Name")
            assert names and names <= functions, f"{name}: {names} are not registered functions"
        elif table == "customEvents":
            assert _names(query) == {ALERT_EVENT}, name
            assert f'"{ALERT_EVENT}"' in code, f"nothing in orderflow/ or agent/ emits the {ALERT_EVENT} event"
        else:
            raise AssertionError(f"{name}: teach this test what {table} holds")


# A KQL parse column's type and the printf placeholder (Python logging's %-format) that writes such a value.
_PLACEHOLDERS = {"": r"%s", "string": r"%s", "long": r"%d", "int": r"%d", "real": r"%(?:\.\d+)?f"}


def _format_regex(pattern: str) -> str:
    """A regex over a logging format string for a KQL `parse ... with` pattern ("text" col:type ... *)."""
    regex = ""
    for literal, star, _column, kind in re.findall(r'"([^"]*)"|(\*)|(\w+)(?::(\w+))?', pattern):
        if star:
            regex += ".*"
        elif _column:
            regex += _PLACEHOLDERS[kind]
        else:
            regex += re.escape(literal)
    return regex


def test_the_parse_check_reads_columns_as_placeholders() -> None:
    regex = _format_regex('"scan (" mode "): " expired:long " expired, " ru:real " RU" *')
    assert re.match(regex, "scan (%s): %d expired, %.2f RU, %d queries")
    assert not re.match(regex, "scan (%s): %d expired, cost %.2f RU")


def test_metric_tiles_read_a_listed_platform_metric_of_the_namespace() -> None:
    for item in _of_type(10):
        content = item["content"]
        assert content["resourceType"] == "microsoft.servicebus/namespaces"
        assert content["resourceIds"] == [SERVICE_BUS_ID]
        (namespace,) = [n for n in PLATFORM_METRICS if n.lower() == content["resourceType"]]
        for metric in content["metrics"]:
            assert metric["namespace"] == content["resourceType"]
            assert metric["metric"].startswith(f"{content['resourceType']}--")
            assert metric["metric"].split("--", 1)[1] in PLATFORM_METRICS[namespace], metric


def test_the_workbook_holds_no_key() -> None:
    source = WORKBOOK_JSON.read_text() + WORKBOOK_BICEP.read_text()
    for pattern in FORBIDDEN:
        assert not re.search(pattern, source, re.IGNORECASE), pattern


def test_deploy_docs_describe_the_workbook() -> None:
    doc = Path(REPO / "docs" / "deploy.md").read_text()
    match = re.search(r"^### Operations workbook\n(.*?)(?=^#{1,3} |\Z)", doc, re.MULTILINE | re.DOTALL)
    assert match, "docs/deploy.md has no 'Operations workbook' section"
    section = match.group(1)
    for needle in (
        *OUTPUTS,
        *METRIC_ATTRIBUTES,
        "DeadletteredMessages",
        ALERT_EVENT,
        "supervisor scan",
        "oldest Pending",
        "approximate",
        "workspace-based",
        "Monitoring Reader",
    ):
        assert needle in section, needle
