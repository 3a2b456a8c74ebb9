"""Telemetry: alerts, Supervisor figures, orders per state, completions, latency and dead-letter depth are emitted as
OpenTelemetry metrics (the suite's in-memory reader); each operator alert is also an event (a log record that
Application Insights turns into a customEvents row); the exporters follow the environment."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from opentelemetry import metrics
from opentelemetry.instrumentation.logging.handler import LoggingHandler
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from support.integration_support import Pipeline, claim_orders, state_of, submit_orders
from support.product_app import user_function

from agent.handler import circuit_alerter
from orderflow import admission, telemetry
from orderflow import function_names as fn
from orderflow.breaker import BreakerState, Transition
from orderflow.messages import STEPS, AlertKind
from orderflow.notifications import notify_terminal
from orderflow.outbound import raise_alert
from orderflow.records import format_utc
from orderflow.workflow import WORKFLOW_VERSION


def _value(points: dict[str, list[object]], name: str, attr: str = "value", **attributes: str) -> float:
    return sum(getattr(p, attr) for p in points.get(name, []) if dict(p.attributes or {}) == attributes)  # type: ignore[attr-defined]


def _completed(before: dict[str, list[object]], after: dict[str, list[object]], state: str) -> tuple[float, ...]:
    """What ending orders in `state` added: (orders completed, duration data points, duration seconds)."""
    return tuple(
        _value(after, name, attr, state=state) - _value(before, name, attr, state=state)
        for name, attr in (
            ("orderflow.orders.completed", "value"),
            ("orderflow.order.duration", "count"),
            ("orderflow.order.duration", "sum"),
        )
    )


def test_alerts_errors_and_supervisor_scans_are_metrics(metric_points: Callable[[], dict[str, list[object]]]) -> None:
    before = metric_points()
    telemetry.count_alert("UnitTestKind")
    telemetry.count_order_error()
    telemetry.record_supervisor_scan(3.5, recovered=2, escalated=1)
    after = metric_points()
    assert (
        _value(after, "orderflow.alerts", kind="UnitTestKind") - _value(before, "orderflow.alerts", kind="UnitTestKind")
        == 1
    )
    assert _value(after, "orderflow.orders.error") - _value(before, "orderflow.orders.error") == 1
    assert (
        _value(after, "orderflow.supervisor.request_charge", "sum")
        - _value(before, "orderflow.supervisor.request_charge", "sum")
        == 3.5
    )
    assert _value(after, "orderflow.supervisor.recovered") - _value(before, "orderflow.supervisor.recovered") == 2


def test_no_exporter_without_a_connection_string() -> None:
    assert telemetry.configure_from_env({}) is False


# --- issue 14: orders per state, completions, end-to-end latency, dead-letter depth, alerts as events ---------------


def _gauge(points: dict[str, list[object]], name: str, **attributes: str) -> float | None:
    found = [p for p in points.get(name, []) if dict(p.attributes or {}) == attributes]  # type: ignore[attr-defined]
    return found[-1].value if found else None  # type: ignore[attr-defined]


def test_the_gauges_report_the_last_figures_set(metric_points: Callable[[], dict[str, list[object]]]) -> None:
    telemetry.set_orders_in_state("UnitTestState", 7)
    telemetry.set_orders_in_state("UnitTestState", 3)  # a later count replaces the earlier one
    telemetry.set_orders_in_state("OtherUnitTestState", 1)
    telemetry.set_deadletter_depth("unit-test-queue", 4)
    points = metric_points()
    assert _gauge(points, "orderflow.orders.in_state", state="UnitTestState") == 3
    assert _gauge(points, "orderflow.orders.in_state", state="OtherUnitTestState") == 1
    assert _gauge(points, "orderflow.deadletter.depth", queue="unit-test-queue") == 4


def test_completions_and_durations_by_terminal_state(metric_points: Callable[[], dict[str, list[object]]]) -> None:
    before = metric_points()
    telemetry.count_order_completed("UnitTestEnd")
    telemetry.record_order_duration("UnitTestEnd", 2.5)
    after = metric_points()
    assert _completed(before, after, "UnitTestEnd") == (1, 1, 2.5)


async def test_an_order_is_counted_once_when_it_ends_with_its_latency(
    p: Pipeline, metric_points: Callable[[], dict[str, list[object]]]
) -> None:
    """Counted by the write that records the notification (notifiedAt): a repeated notification counts nothing."""
    await claim_orders(p, "o-1")
    before = metric_points()
    result: dict[str, object] | None = None
    for step in STEPS:
        assert await _advance(p, result) == {"send": step.value}
        p.clock.advance(1.25)
        result = {"step": step.value, "status": "succeeded", "error": None}
    assert await _advance(p, result) == {"done": "Processed"}
    ended = await state_of(p, "o-1")
    await notify_terminal(p.services, ended)  # the Supervisor's sweep, or a retried activity, sends it again
    after = metric_points()
    assert _completed(before, after, "Processed") == (1, 1, 3.75)  # 3.75 s: createdAt → Processed


async def _advance(p: Pipeline, result: dict[str, object] | None) -> object:
    return await user_function(fn.ADVANCE_ORDER)(
        {
            "orderId": "o-1",
            "instanceId": "o-1:1",
            "attempt": 1,
            "workflowVersion": WORKFLOW_VERSION,
            "agentRetries": 4,
            "completeBy": format_utc(p.clock.now() + timedelta(seconds=10)),
            "result": result,
            "cancel": False,
        }
    )


async def test_the_starters_admission_refresh_sets_orders_per_state(
    p: Pipeline, metric_points: Callable[[], dict[str, list[object]]]
) -> None:
    await submit_orders(p, "o-1", "o-2", "o-3")
    await admission.refresh(p.services)
    points = metric_points()
    assert _gauge(points, "orderflow.orders.in_state", state="Pending") == 3
    assert _gauge(points, "orderflow.orders.in_state", state="Processing") == 0


@pytest.fixture
def alert_logs() -> Iterator[InMemoryLogRecordExporter]:
    """What the `orderflow` loggers hand OpenTelemetry, through the handler azure-monitor-opentelemetry installs on
    them (logger_name="orderflow"; azure/monitor/opentelemetry/_configure.py), on an in-memory exporter."""
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    handler = LoggingHandler(logger_provider=provider)
    logger = logging.getLogger("orderflow")
    logger.addHandler(handler)
    yield exporter
    logger.removeHandler(handler)
    provider.shutdown()


def _events(exporter: InMemoryLogRecordExporter) -> list[dict[str, object]]:
    return [
        dict(r.log_record.attributes or {})
        for r in exporter.get_finished_logs()
        if (r.log_record.attributes or {}).get(telemetry.CUSTOM_EVENT_ATTRIBUTE) is not None
    ]


async def test_each_operator_alert_is_an_event(p: Pipeline, alert_logs: InMemoryLogRecordExporter) -> None:
    await raise_alert(
        p.services.bus,
        p.services.tunables.alerts_queue,
        kind=AlertKind.ORDER_FAILED,
        order_id="o-9",
        reason="charge-payment: Declined",
        now=p.clock.now(),
        details={"attempt": 1},
    )
    alerter = circuit_alerter(_Sent(), p.clock)
    await alerter(
        Transition(
            service="remote",
            before=BreakerState.CLOSED,
            after=BreakerState.OPEN,
            changed_at=p.clock.now(),
            reason="5 failures",
        )
    )
    events = _events(alert_logs)
    assert [{k: e.get(k) for k in ("microsoft.custom_event.name", "kind", "orderId", "reason")} for e in events] == [
        {
            "microsoft.custom_event.name": "OrderflowAlert",
            "kind": "OrderFailed",
            "orderId": "o-9",
            "reason": "charge-payment: Declined",
        },
        {
            "microsoft.custom_event.name": "OrderflowAlert",
            "kind": "CircuitOpened",
            "orderId": None,
            "reason": "5 failures",
        },
    ]


class _Sent:
    async def send_messages(self, message: object) -> None:
        return None


def test_console_exporters_follow_the_otel_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    installed: list[object] = []
    monkeypatch.setattr(trace, "set_tracer_provider", installed.append)
    monkeypatch.setattr(metrics, "set_meter_provider", installed.append)
    assert telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "console"}, service_name="orderflow-agent") is True
    [provider] = installed
    assert isinstance(provider, TracerProvider)
    assert provider.resource.attributes["service.name"] == "orderflow-agent"
    provider.shutdown()
    assert telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "otlp"}) is False  # only the console is built in
    assert len(installed) == 1


def test_azure_monitor_names_the_agent_unless_otel_service_name_does(monkeypatch: pytest.MonkeyPatch) -> None:
    import azure.monitor.opentelemetry

    seen: list[dict[str, object]] = []
    monkeypatch.setattr(azure.monitor.opentelemetry, "configure_azure_monitor", lambda **kw: seen.append(kw))
    connection = {"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=00000000-0000-0000-0000-000000000000"}
    assert telemetry.configure_from_env(connection, service_name="orderflow-agent")
    assert telemetry.configure_from_env({**connection, "OTEL_SERVICE_NAME": "mine"}, service_name="orderflow-agent")
    assert telemetry.configure_from_env(connection)
    named, by_env, function_app = seen
    assert named["resource"].attributes["service.name"] == "orderflow-agent"  # type: ignore[attr-defined]
    assert "resource" not in by_env and "resource" not in function_app
