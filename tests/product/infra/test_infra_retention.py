"""Issue 26, the infra side: data that ends, backups, and alerts before stuck.

- The orders and the state-record containers have Time to Live on with no default expiry (defaultTtl -1), so the
  per-document `ttl` the app sets on a finished order takes effect and nothing without one expires; the checkpoint and
  breaker containers have no TTL, the recovery index keeps its own (Time to Live in Azure Cosmos DB,
  https://learn.microsoft.com/azure/cosmos-db/nosql/time-to-live).
- The Cosmos DB account has continuous backup, its tier a main.bicep parameter that azd fills.
- The Durable Task Scheduler's retention policy is InstanceRetentionSeconds in whole days, rounded up, 1 to 90.
- The retentions and SenderDeadLetterAlarmDepth are parameters, each one value wherever infra/ uses it.
- One alert per app alarm (oldest-pending, oldest-processing, backlog-growth) on `orderflow.alarm.firing`, and every
  alert's description names its runbook row of README's "Operating it".
- docs/deploy.md, "Retention and backup", says all of it, with az commands whose flags exist.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from support.bicep_tree import (
    REPO,
    Opaque,
    Scope,
    all_files,
    app,
    azd_parameters,
    code_children,
    evaluate,
    main,
    module_scope,
    object_get,
    string_parts,
    string_value,
    text,
    with_params,
)
from tree_sitter import Node

from orderflow import settings
from orderflow.records import TTL_NEVER

CONTAINERS = "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers"
ALARM_FIRING = "orderflow.alarm.firing"
# Each alert rule's runbook step: the row of README's "Operating it" table (the rows: issue 26's list).
RUNBOOK = {
    "oldestPending": "Orders wait too long in Pending",
    "oldestProcessing": "Orders stay too long in Processing",
    "backlogGrowth": "The backlog grows faster than it drains",
    "deadLetters": "A dead-letter queue grows",
    "senderDeadLetters": "A dead-letter queue grows",
    "ordersInError": "Which orders failed, and why?",
    "badInput": "What is in the dead-letter queue, and why?",
    "supervisorSilent": "Is the Supervisor running, and what does a scan cost?",
    "circuitOpen": "Is the remote service down?",
}
RUNBOOK_LINE = re.compile(r'Runbook: README "Operating it", "([^"]+)"')
# (rule, the app's alarm name, severity): Sev-2 for orders that wait or hang, Sev-3 for a load to watch.
ALARM_RULES = [
    ("oldestPending", "oldest-pending", 2),
    ("oldestProcessing", "oldest-processing", 2),
    ("backlogGrowth", "backlog-growth", 3),
]
DAY = 86400


def _cosmos() -> Scope:
    return module_scope(Scope(main()), main().module("cosmos"))


def _container(symbol: str, scope: Scope | None = None) -> dict[str, Any]:
    scope = scope or _cosmos()
    return evaluate(scope.file.resource(symbol).get("properties", "resource"), scope)


def _allowed(bicep_file, name: str) -> set[str]:
    """The string values of a parameter's @allowed([...]) decorator."""
    for decl in code_children(bicep_file.root):
        if decl.type == "parameter_declaration" and text(decl.named_children[0]) == name:
            previous = decl.prev_named_sibling
            assert previous is not None and previous.type == "decorators", f"{name} has no decorators"
            (allowed,) = [d for d in previous.named_children if text(d).startswith("@allowed(")]
            return set(re.findall(r"'([^']*)'", text(allowed)))
    raise KeyError(name)


# ---------------------------------------------------------------- integer arithmetic, as ARM evaluates it

_CALLS = {
    "min": min,
    "max": max,
    "string": str,
    "int": int,
}


def reduce(node: Node, file, values: dict[str, Any]) -> Any:
    """A Bicep expression over numbers, as ARM evaluates it: + - * and integer `/` (truncating), comparisons, `?:`,
    min/max/string/int, parameters from `values` (else their defaults) and the file's variables. The shared evaluator
    (support.bicep_tree.evaluate) leaves arithmetic opaque; this one is for the few expressions that compute numbers."""
    kind = node.type
    if kind == "number":
        return int(text(node))
    if kind == "string":
        literal = string_value(node)
        assert literal is not None, text(node)
        return literal
    if kind == "parenthesized_expression":
        return reduce(node.named_children[0], file, values)
    if kind == "identifier":
        name = text(node)
        if name in values:
            return values[name]
        if name in file.variables:
            return reduce(file.variables[name], file, values)
        default = file.params.get(name)
        assert default is not None, f"{file.name}: {name} has no value"
        return reduce(default, file, values)
    if kind == "ternary_expression":
        condition, when_true, when_false = code_children(node)
        return reduce(when_true if reduce(condition, file, values) else when_false, file, values)
    if kind == "binary_expression":
        left_node, right_node = code_children(node)
        operator = next(child.type for child in node.children if not child.is_named)
        left, right = reduce(left_node, file, values), reduce(right_node, file, values)
        if operator == "/":
            assert right != 0
            return int(left / right) if abs(left) < 2**52 else left // right  # truncates toward zero, as ARM's div
        return {
            "+": lambda: left + right,
            "-": lambda: left - right,
            "*": lambda: left * right,
            "==": lambda: left == right,
            "!=": lambda: left != right,
            "<": lambda: left < right,
            ">": lambda: left > right,
            "<=": lambda: left <= right,
            ">=": lambda: left >= right,
        }[operator]()
    if kind == "call_expression":
        function = text(node.named_children[0])
        args = [reduce(a, file, values) for a in node.named_children[-1].named_children]
        assert function in _CALLS, f"teach reduce() {function}()"
        return _CALLS[function](*args)
    raise AssertionError(f"{file.name}: cannot reduce {text(node)!r}")


def test_reduce_follows_arm_integer_arithmetic() -> None:
    # A guard on the helper: ARM's integer division truncates, so ceil(a / b) must be written (a + b - 1) / b.
    from support.bicep_tree import literal

    dts = app("durable-task-scheduler.bicep")
    assert reduce(literal("(86401 + 86400 - 1) / 86400"), dts, {}) == 2
    assert reduce(literal("86401 / 86400"), dts, {}) == 1
    assert reduce(literal("min(90, max(1, 0))"), dts, {}) == 1
    assert reduce(literal("1 == 0 ? 5 : string(7)"), dts, {}) == "7"


# ---------------------------------------------------------------- Cosmos DB: TTL on, default off


def test_orders_and_state_have_ttl_on_without_default_expiry() -> None:
    # -1: TTL on, an item without `ttl` never expires, an item with `ttl` = n expires n s after its last write. A
    # missing (null) defaultTtl would make Cosmos DB ignore the `ttl` the app writes on finished orders.
    for symbol, setting in (("ordersContainer", "OrdersContainerName"), ("stateContainer", "StateContainerName")):
        container = _container(symbol)
        assert container["id"] == settings.get(setting, env={})
        assert container["defaultTtl"] == -1, symbol
    # The code's "never" is the same -1 (orderflow keep), whatever the container default is.
    assert TTL_NEVER == -1


def test_checkpoints_and_breakers_have_no_ttl_and_the_recovery_index_keeps_its_own() -> None:
    for symbol in ("checkpointContainer", "circuitBreakerContainer"):
        assert "defaultTtl" not in _container(symbol), symbol
    assert _container("recoveryIndexContainer")["defaultTtl"] == 7 * DAY
    # Every container is one of these: a new one must take a side here.
    symbols = {r.symbol for r in _cosmos().file.resources_of(CONTAINERS)}
    assert symbols == {
        "ordersContainer",
        "stateContainer",
        "checkpointContainer",
        "circuitBreakerContainer",
        "recoveryIndexContainer",
    }


def test_the_ttl_choice_is_explained_with_its_source() -> None:
    source = (REPO / "infra" / "app" / "cosmos.bicep").read_text()
    assert "https://learn.microsoft.com/azure/cosmos-db/nosql/time-to-live" in source
    assert "DefaultTimeToLive" in source and "-1" in source


# ---------------------------------------------------------------- Cosmos DB: continuous backup


def test_backup_policy_is_continuous_with_the_tier_parameter() -> None:
    account = app("cosmos.bicep").resource("account")
    policy = evaluate(account.get("properties", "backupPolicy"), _cosmos())
    assert policy == {"type": "Continuous", "continuousModeProperties": {"tier": "Continuous7Days"}}
    assert text(main().module("cosmos").params()["backupTier"]) == "cosmosBackupTier"
    longer = module_scope(with_params(Scope(main()), cosmosBackupTier="'Continuous30Days'"), main().module("cosmos"))
    assert evaluate(account.get("properties", "backupPolicy"), longer)["continuousModeProperties"] == {
        "tier": "Continuous30Days"
    }
    tiers = {"Continuous7Days", "Continuous30Days"}
    assert _allowed(main(), "cosmosBackupTier") == tiers == _allowed(app("cosmos.bicep"), "backupTier")
    assert evaluate(main().params["cosmosBackupTier"], Scope(main())) == "Continuous7Days"


def test_azd_passes_the_backup_tier() -> None:
    assert azd_parameters({})["cosmosBackupTier"] == "Continuous7Days"
    assert azd_parameters({"ORDERFLOW_COSMOS_BACKUP_TIER": "Continuous30Days"})["cosmosBackupTier"] == (
        "Continuous30Days"
    )


# ---------------------------------------------------------------- the Durable Task Scheduler's retention


def _dts_days(seconds: int) -> int:
    dts = app("durable-task-scheduler.bicep")
    return reduce(dts.variables["instanceRetentionDays"], dts, {"instanceRetentionSeconds": seconds})


@pytest.mark.parametrize(
    "seconds",
    [1, 3600, DAY - 1, DAY, DAY + 1, 2592000, 7776000, 89 * DAY + 1, 90 * DAY, 90 * DAY + 1, 10**9],
)
def test_dts_retention_is_instance_retention_in_days_rounded_up_1_to_90(seconds: int) -> None:
    # The scheduler takes 0..90 days (0: purge as soon as possible): whole days, rounded up, at least 1, at most 90.
    assert _dts_days(seconds) == min(90, max(1, math.ceil(seconds / DAY)))


def test_dts_retention_of_never_purge_is_the_schedulers_maximum() -> None:
    # The app's 0 is "never purge"; the scheduler's 0 is "at once": the most it keeps instead.
    assert _dts_days(0) == 90


def test_dts_retention_policy_resource() -> None:
    dts = app("durable-task-scheduler.bicep")
    policy = dts.resource("retentionPolicy")
    assert policy.type == "Microsoft.DurableTask/schedulers/retentionPolicies"
    assert policy.api_version == "2025-11-01"
    assert policy.parent is not None and policy.parent.symbol == "scheduler"
    assert evaluate(policy.get("name"), Scope(dts)) == "default"  # the only name the type allows
    (entry,) = policy.get("properties", "retentionPolicies").named_children
    # No orchestrationState: one policy for every terminal state (Completed, Failed, Canceled, Terminated).
    assert object_get(entry, "orchestrationState") is None
    assert text(object_get(entry, "retentionPeriodInDays")) == "instanceRetentionDays"
    # Deployed with the scheduler, so only with durableBackend=DurableTaskScheduler.
    assert text(main().module("durableTaskScheduler").condition) == "(useDurableTaskScheduler)"
    assert _dts_days(reduce(main().params["instanceRetentionSeconds"], main(), {})) == 30


def test_one_instance_retention_for_the_app_and_the_scheduler() -> None:
    assert (
        text(main().module("durableTaskScheduler").params()["instanceRetentionSeconds"]) == "instanceRetentionSeconds"
    )
    assert text(main().module("functionApp").params()["instanceRetentionSeconds"]) == "instanceRetentionSeconds"


# ---------------------------------------------------------------- the app settings that have a parameter


def _code_setting(name: str) -> Node:
    from support.bicep_tree import object_items

    (node,) = [v for k, v in object_items(app("function.bicep").variables["codeSettings"]) if k == name]
    return node


@pytest.mark.parametrize(
    ("setting", "main_param", "function_param"),
    [
        ("FinishedOrderRetentionSeconds", "finishedOrderRetentionSeconds", "finishedOrderRetentionSeconds"),
        ("InstanceRetentionSeconds", "instanceRetentionSeconds", "instanceRetentionSeconds"),
        ("SenderDeadLetterAlarmDepth", "badInputThreshold", "senderDeadLetterAlarmDepth"),
    ],
)
def test_settings_with_a_parameter_default_to_the_registered_value(
    setting: str, main_param: str, function_param: str
) -> None:
    function = app("function.bicep")
    assert text(_code_setting(setting)) == f"string({function_param})"
    assert text(main().module("functionApp").params()[function_param]) == main_param
    default = settings.get(setting, env={})
    assert reduce(_code_setting(setting), main(), {function_param: reduce(main().params[main_param], main(), {})}) == (
        default
    )
    # The module's own default agrees, for a deployment of function.bicep alone.
    assert str(reduce(function.params[function_param], function, {})) == default


def test_the_sender_dead_letter_depth_is_one_value_for_the_alert_and_the_app() -> None:
    alerts_param = main().module("alerts").params()["badInputThreshold"]
    function_param = main().module("functionApp").params()["senderDeadLetterAlarmDepth"]
    assert text(alerts_param) == text(function_param) == "badInputThreshold"
    # ...and that value is the sender dead-letter alert's threshold.
    (criterion,) = (
        app("alerts.bicep").resource("senderDeadLetters").get("properties", "criteria", "allOf").named_children
    )
    assert text(object_get(criterion, "threshold")) == "badInputThreshold"
    assert (
        evaluate(main().params["badInputThreshold"], Scope(main()))
        == 20
        == int(settings.get("SenderDeadLetterAlarmDepth", env={}))
    )


def test_app_setting_overrides_may_not_split_a_parameter_setting() -> None:
    from support.bicep_tree import object_items

    mapping = {k: string_value(v) for k, v in object_items(main().variables["settingsWithParameters"])}
    assert mapping == {
        "FinishedOrderRetentionSeconds": "finishedOrderRetentionSeconds",
        "InstanceRetentionSeconds": "instanceRetentionSeconds",
        "SenderDeadLetterAlarmDepth": "badInputThreshold",
    }
    assert set(mapping.values()) <= set(main().params)
    check = text(main().variables["overriddenSettingParameters"])
    assert "contains(appSettingOverrides, setting.key)" in check
    assert "fail(" in text(main().variables["settingParametersNotOverridden"])


def test_the_other_new_settings_are_the_registered_defaults() -> None:
    scope = module_scope(Scope(main()), main().module("functionApp"))
    for name in (
        "PurgeSchedule",
        "PurgeWindowSeconds",
        "PurgeMaxInstancesPerCall",
        "PurgeMaxCallsPerRun",
        "AlarmSchedule",
        "BacklogGrowthAlarmOrders",
        "BacklogGrowthWindowSeconds",
    ):
        assert evaluate(_code_setting(name), scope) == settings.get(name, env={}), name


# ---------------------------------------------------------------- alerts before stuck


def _interpolate(node: Node, scope: Scope) -> str:
    def resolve(child: Node) -> str:
        value = evaluate(child.named_children[0], scope)
        return value if isinstance(value, str) else text(child)

    return str(string_parts(node, resolve))


@pytest.mark.parametrize(("symbol", "alarm", "severity"), ALARM_RULES)
def test_each_alarm_has_its_alert_on_the_firing_gauge(symbol: str, alarm: str, severity: int) -> None:
    alerts = app("alerts.bicep")
    scope = Scope(alerts)
    rule = alerts.resource(symbol)
    assert rule.type == "Microsoft.Insights/scheduledQueryRules"
    properties = evaluate(rule.get("properties"), scope)
    assert properties["severity"] == severity and properties["enabled"] is True
    assert text(rule.get("properties", "actions", "actionGroups")) == "actions"
    assert text(rule.get("properties", "scopes")).split() == ["[", "applicationInsightsId", "]"]
    (criterion,) = rule.get("properties", "criteria", "allOf").named_children
    query = _interpolate(object_get(criterion, "query"), scope)
    assert query.startswith("customMetrics "), query
    assert re.search(rf'\bname\s*==\s*"{re.escape(ALARM_FIRING)}"', query), query
    assert re.search(rf'customDimensions\["alarm"\]\)\s*==\s*"{re.escape(alarm)}"', query), query
    values = evaluate(criterion, scope)
    # 1 firing, 0 quiet: fire on any 1 in the window.
    assert (values["operator"], values["threshold"]) in {("GreaterThan", 0), ("GreaterThanOrEqual", 1)}
    assert values["timeAggregation"] == "Maximum"
    assert values["metricMeasureColumn"] in re.findall(r"summarize\s+(\w+)\s*=\s*max\(", query)


def test_the_rules_use_the_apps_alarm_names_and_runbook_rows() -> None:
    from orderflow import alarms

    assert {alarm for _, alarm, _ in ALARM_RULES} == {
        alarms.OLDEST_PENDING,
        alarms.OLDEST_PROCESSING,
        alarms.BACKLOG_GROWTH,
    }
    for symbol, alarm, _ in ALARM_RULES:
        assert alarms.RUNBOOK[alarm] == RUNBOOK[symbol], alarm
    # The app's fourth alarm has the Service Bus metric alerts, with the same runbook row.
    assert alarms.RUNBOOK[alarms.DEAD_LETTERS] == RUNBOOK["deadLetters"] == RUNBOOK["senderDeadLetters"]


def test_one_alert_per_alarm_and_the_dead_letter_alerts_stay() -> None:
    alerts = app("alerts.bicep")
    alarms = re.findall(
        r'customDimensions\["alarm"\]\)\s*==\s*"([^"]+)"',
        " ".join(_interpolate(object_get(c, "query"), Scope(alerts)) for c in _criteria(alerts)),
    )
    assert sorted(alarms) == sorted(alarm for _, alarm, _ in ALARM_RULES)
    for symbol in ("deadLetters", "senderDeadLetters"):
        assert alerts.resource(symbol).type == "Microsoft.Insights/metricAlerts"


def _criteria(alerts) -> list[Node]:
    return [
        c
        for r in alerts.resources_of("Microsoft.Insights/scheduledQueryRules")
        for c in r.get("properties", "criteria", "allOf").named_children
    ]


# ---------------------------------------------------------------- runbook rows


def _alert_rules() -> list:
    return [
        r
        for f in all_files()
        for t in ("Microsoft.Insights/metricAlerts", "Microsoft.Insights/scheduledQueryRules")
        for r in f.resources_of(t)
    ]


def test_every_alert_names_its_runbook_row() -> None:
    rules = _alert_rules()
    assert {r.symbol for r in rules} == set(RUNBOOK), "a new alert needs its runbook row here and in its description"
    for rule in rules:
        description = rule.get("properties", "description")
        assert description is not None and description.type == "string", rule.symbol
        rows = RUNBOOK_LINE.findall(text(description))
        assert rows == [RUNBOOK[rule.symbol]], f"{rule.symbol}: {rows}"


def test_the_runbook_rows_are_the_issue_list() -> None:
    assert set(RUNBOOK.values()) == {
        "Orders wait too long in Pending",
        "Orders stay too long in Processing",
        "The backlog grows faster than it drains",
        "A dead-letter queue grows",
        "Which orders failed, and why?",
        "What is in the dead-letter queue, and why?",
        "Is the Supervisor running, and what does a scan cost?",
        "Is the remote service down?",
    }
    assert all(isinstance(v, str) and not isinstance(v, Opaque) for v in RUNBOOK.values())


# ---------------------------------------------------------------- docs/deploy.md


def _docs_section(title: str) -> str:
    doc = (REPO / "docs" / "deploy.md").read_text()
    match = re.search(rf"^(#+) {re.escape(title)}\n(.*?)(?=^#{{1,3}} |\Z)", doc, re.MULTILINE | re.DOTALL)
    assert match, f"docs/deploy.md has no {title!r} section"
    return match.group(2)


def test_deploy_doc_has_the_retention_and_backup_section() -> None:
    section = _docs_section("Retention and backup")
    for needle in (
        "FinishedOrderRetentionSeconds",
        "InstanceRetentionSeconds",
        "purge_instance_history_by",
        "defaultTtl: -1",
        "retentionPolicies",
        "cosmosBackupTier",
        "ORDERFLOW_COSMOS_BACKUP_TIER",
        "Continuous7Days",
        "Continuous30Days",
        "az cosmosdb restore",
        "--disable-ttl True",
        "--databases-to-restore",
        "upsert_item",
        "CosmosRestoreOperator",
        "Supervisor",
        "Durable Task Scheduler",
        ALARM_FIRING,
    ):
        assert needle in section, needle


def test_deploy_doc_alerts_table_names_every_runbook_row() -> None:
    section = _docs_section("Alerts")
    for row in set(RUNBOOK.values()):
        assert f"| {row} |" in section, row
    for _, alarm, _ in ALARM_RULES:
        assert f"`{alarm}`" in section, alarm


# The flags of each az command the section runs, as azure-cli declares them (src/azure-cli/azure/cli/command_modules/
# cosmosdb/_params.py: argument_context('cosmosdb restore'), ('cosmosdb restorable-database-account list'),
# ('cosmosdb sql restorable-resource'), ('cosmosdb sql role assignment'); role: 'role assignment create'), plus the
# global --resource-group.
AZ_FLAGS = {
    "az cosmosdb restore": {
        "--resource-group",
        "--account-name",
        "--target-database-account-name",
        "--restore-timestamp",
        "--location",
        "--databases-to-restore",
        "--public-network-access",
        "--disable-ttl",
    },
    "az cosmosdb restorable-database-account list": {"--account-name", "--location"},
    "az cosmosdb sql restorable-resource list": {
        "--instance-id",
        "--location",
        "--restore-location",
        "--restore-timestamp",
    },
    "az cosmosdb sql role assignment create": {
        "--account-name",
        "--resource-group",
        "--role-definition-id",
        "--scope",
        "--principal-id",
    },
    "az role assignment create": {"--role", "--assignee", "--scope"},
}


def test_deploy_doc_az_commands_use_flags_that_exist() -> None:
    section = _docs_section("Retention and backup")
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    commands = [
        re.sub(r"#[^\n]*", "", command).replace("\\\n", " ")
        for block in blocks
        for command in re.split(r"\n(?=az )", block.replace("\\\n", " "))
        if command.startswith("az cosmosdb") or command.startswith("az role")
    ]
    checked = set()
    for command in commands:
        name = next((n for n in sorted(AZ_FLAGS, key=len, reverse=True) if command.startswith(n)), None)
        assert name is not None, f"teach this test the flags of: {command}"
        flags = set(re.findall(r"(?<!\S)(--[a-z-]+)", command))
        assert flags <= AZ_FLAGS[name], f"{name}: {flags - AZ_FLAGS[name]}"
        if name == "az cosmosdb restore":
            # The restored containers keep defaultTtl -1: without this, finished orders whose ttl ran out expire again.
            assert re.search(r"--disable-ttl True\b", command), command
        checked.add(name)
    assert checked == set(AZ_FLAGS)
