"""Registration contract: index `app.get_functions()` of the product app and assert every trigger's settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orderflow import function_names as fn
from orderflow.settings import SETTING_NAMES

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def triggers() -> dict[str, dict[str, Any]]:
    from devhost.app_loader import index, load_app

    return {spec.name: spec.trigger for spec in index(load_app(ROOT))}


def test_every_function_is_registered_under_its_constant(triggers: dict[str, dict[str, Any]]) -> None:
    expected = {
        fn.SUBMISSION: "serviceBusTrigger",
        fn.submission_of("app"): "serviceBusTrigger",
        fn.STARTER_TIMER: "timerTrigger",
        fn.AGENT_REPLIES: "serviceBusTrigger",
        fn.SUPERVISOR: "timerTrigger",
        fn.ALARMS: "timerTrigger",
        fn.PURGE: "timerTrigger",
        fn.ORDER_WORKFLOW: "orchestrationTrigger",
        fn.SET_STEP_DEADLINE: "activityTrigger",
        fn.LOAD_ORDER: "activityTrigger",
        fn.SEND_AGENT_REQUEST: "activityTrigger",
        fn.RECORD_STEP_RESULT: "activityTrigger",
        fn.FINISH_ORDER: "activityTrigger",
        fn.DEFER_ORDER: "activityTrigger",
        fn.BEGIN_COMPENSATION: "activityTrigger",
        fn.ADVANCE_ORDER: "activityTrigger",
        fn.OPS_ORDER: "httpTrigger",
        fn.OPS_ORDERS: "httpTrigger",
        fn.OPS_RESUBMIT: "httpTrigger",
        fn.OPS_CANCEL: "httpTrigger",
        fn.OPS_SUMMARY: "httpTrigger",
        fn.OPS_OPENAPI: "httpTrigger",
    }
    assert {name: t["type"] for name, t in triggers.items()} == expected


def test_the_ops_api_serves_exactly_the_documented_operations_with_function_keys(
    triggers: dict[str, dict[str, Any]],
) -> None:
    """Each route and method in the OpenAPI document is one httpTrigger, and every one needs a function key."""
    from orderflow.openapi import document

    served = {
        (f"/{t['route']}", str(m).lower())
        for t in triggers.values()
        if t["type"] == "httpTrigger"
        for m in t["methods"]
    }
    documented = {(path, method) for path, item in document()["paths"].items() for method in item}
    assert served == documented
    assert {t["authLevel"] for t in triggers.values() if t["type"] == "httpTrigger"} == {"function"}


def test_service_bus_triggers_use_session_queues_named_by_settings(triggers: dict[str, dict[str, Any]]) -> None:
    submission, replies = triggers[fn.SUBMISSION], triggers[fn.AGENT_REPLIES]
    assert submission["queueName"] == "%OrdersQueueName%" and submission["isSessionsEnabled"] is True
    assert submission["connection"] == "ServiceBusConnection"
    # The submission settles itself (dead-letter with a reason): auto-complete must be off for it alone.
    assert submission["autoCompleteMessages"] is False
    assert replies["queueName"] == "%AgentRepliesQueueName%" and replies["isSessionsEnabled"] is True
    assert replies.get("autoCompleteMessages", True) is True


def test_timers_run_from_settings_without_the_monitor(triggers: dict[str, dict[str, Any]]) -> None:
    # The default schedules are sub-minute; the timer extension turns useMonitor off for them anyway
    # (TimerSchedule.Create, azure-webjobs-sdk-extensions), so the app says so (tests/product/unit/test_host_json.py).
    for name, setting in (
        (fn.STARTER_TIMER, "%StarterSchedule%"),
        (fn.SUPERVISOR, "%SupervisorSchedule%"),
        (fn.ALARMS, "%AlarmSchedule%"),  # every minute: a missed tick is not worth running late
    ):
        assert triggers[name]["schedule"] == setting
        assert triggers[name]["useMonitor"] is False and triggers[name]["runOnStartup"] is False


def test_every_binding_expression_names_a_registered_setting(triggers: dict[str, dict[str, Any]]) -> None:
    expressions = {
        v.strip("%")
        for t in triggers.values()
        for v in t.values()
        if isinstance(v, str) and v.startswith("%") and v.endswith("%")
    }
    assert expressions and expressions <= SETTING_NAMES


def test_queues_named_by_the_default_settings_exist_with_sessions() -> None:
    config = json.loads((ROOT / "servicebus.config.json").read_text())
    queues = {q["Name"]: q["Properties"] for ns in config["UserConfig"]["Namespaces"] for q in ns["Queues"]}
    for name in ("orders-inbound", "agent-requests", "agent-replies", "app-status"):
        assert queues[name]["RequiresSession"] is True and queues[name]["RequiresDuplicateDetection"] is True
    assert "operator-alerts" in queues


def test_readme_documents_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in SETTING_NAMES if f"`{name}`" not in readme]
    assert not missing, f"README configuration table lacks {missing}"
