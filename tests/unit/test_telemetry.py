"""Telemetry: alerts and Supervisor figures are emitted as OpenTelemetry metrics (the suite's in-memory reader)."""

from __future__ import annotations

from collections.abc import Callable

from orderflow import telemetry


def _value(points: dict[str, list[object]], name: str, attr: str = "value", **attributes: str) -> float:
    return sum(getattr(p, attr) for p in points.get(name, [])
               if dict(p.attributes or {}) == attributes)  # type: ignore[attr-defined]


def test_alerts_errors_and_supervisor_scans_are_metrics(metric_points: Callable[[], dict[str, list[object]]]) -> None:
    before = metric_points()
    telemetry.count_alert("UnitTestKind")
    telemetry.count_order_error()
    telemetry.record_supervisor_scan(3.5, recovered=2, escalated=1)
    after = metric_points()
    assert _value(after, "orderflow.alerts", kind="UnitTestKind") - _value(before, "orderflow.alerts",
                                                                          kind="UnitTestKind") == 1
    assert _value(after, "orderflow.orders.error") - _value(before, "orderflow.orders.error") == 1
    assert _value(after, "orderflow.supervisor.request_charge", "sum") - _value(
        before, "orderflow.supervisor.request_charge", "sum") == 3.5
    assert _value(after, "orderflow.supervisor.recovered") - _value(before, "orderflow.supervisor.recovered") == 2


def test_no_exporter_without_a_connection_string() -> None:
    assert telemetry.configure_from_env({}) is False
