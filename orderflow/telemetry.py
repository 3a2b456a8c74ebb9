"""Telemetry: OpenTelemetry metrics and the operator-alert log line (the API only; the host configures exporters).

In Azure, `azure-monitor-opentelemetry` exports to Application Insights when APPLICATIONINSIGHTS_CONNECTION_STRING is
set (host.json `telemetryMode: OpenTelemetry`); locally the console; in tests an in-memory reader.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import metrics

METER_NAME = "orderflow"
log = logging.getLogger("orderflow.alerts")


def configure_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Export to Application Insights when APPLICATIONINSIGHTS_CONNECTION_STRING is set (Azure; identity-based
    ingestion via APPLICATIONINSIGHTS_AUTHENTICATION_STRING). Returns whether an exporter was configured."""
    source = os.environ if env is None else env
    if not source.get("APPLICATIONINSIGHTS_CONNECTION_STRING"):
        return False
    from azure.monitor.opentelemetry import configure_azure_monitor  # noqa: PLC0415

    credential = None
    if "Authorization=AAD" in source.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", ""):
        from azure.identity import ManagedIdentityCredential  # noqa: PLC0415

        credential = ManagedIdentityCredential(client_id=source.get("AZURE_CLIENT_ID"))
    configure_azure_monitor(credential=credential, logger_name="orderflow")
    return True


def _meter() -> metrics.Meter:
    return metrics.get_meter(METER_NAME)


def count_alert(kind: str) -> None:
    _meter().create_counter("orderflow.alerts", unit="1", description="Operator alerts raised").add(
        1, {"kind": kind})


def count_order_error() -> None:
    _meter().create_counter("orderflow.orders.error", unit="1", description="Orders moved to Error").add(1)


def record_supervisor_scan(request_charge: float, recovered: int, escalated: int) -> None:
    m = _meter()
    m.create_histogram("orderflow.supervisor.request_charge", unit="RU",
                       description="Request charge of one Supervisor scan").record(request_charge)
    m.create_counter("orderflow.supervisor.recovered", unit="1").add(recovered)
    m.create_counter("orderflow.supervisor.escalated", unit="1").add(escalated)


# The last known state of each remote service's circuit breaker (0 closed, 1 half-open, 2 open), reported by one
# observable gauge: infra/app/alerts.bicep alerts when it reads 2 (open).
_circuit_states: dict[str, int] = {}
_circuit_gauge_registered = False


def _observe_circuits(_options: metrics.CallbackOptions) -> list[metrics.Observation]:
    return [metrics.Observation(value, {"service": service}) for service, value in sorted(_circuit_states.items())]


def set_circuit_state(service: str, value: int) -> None:
    global _circuit_gauge_registered  # noqa: PLW0603 - one gauge per process, registered on first use
    _circuit_states[service] = value
    if not _circuit_gauge_registered:
        _meter().create_observable_gauge("orderflow.circuit.state", callbacks=[_observe_circuits], unit="1",
                                         description="Circuit breaker state per remote service: 0 closed, "
                                                     "1 half-open, 2 open")
        _circuit_gauge_registered = True


def circuit_states() -> dict[str, int]:
    return dict(_circuit_states)


def count_rejected(reason: str) -> None:
    _meter().create_counter("orderflow.admission.rejected", unit="1",
                            description="Orders refused by admission control").add(1, {"reason": reason})
