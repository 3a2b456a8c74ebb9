"""Telemetry: OpenTelemetry metrics, the operator-alert events, and where they (and the traces of
orderflow/tracing.py) are exported. Product code uses the OpenTelemetry API only; `configure_from_env` picks the
exporter once per process (function_app.py for the function app, agent/__main__.py for the Agent):

- APPLICATIONINSIGHTS_CONNECTION_STRING set (Azure): `azure-monitor-opentelemetry` to Application Insights;
- else OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER / OTEL_LOGS_EXPORTER = `console`: printed on stdout, locally;
- else nothing: every span and instrument is a no-op.

docs/telemetry.md lists the metrics, the spans and the alert events; docs/modules-product.md the exporters."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics

METER_NAME = "orderflow"
log = logging.getLogger("orderflow.alerts")

# Alerts as events: a log record on `orderflow.alerts` with this attribute becomes a customEvents row named by it in
# Application Insights (azure-monitor-opentelemetry-exporter, export/logs/_exporter.py: a record with the attribute
# `microsoft.custom_event.name` is sent as an Event envelope, not as a trace).
CUSTOM_EVENT_ATTRIBUTE = "microsoft.custom_event.name"
ALERT_EVENT_NAME = "OrderflowAlert"
CONSOLE = "console"


# Third-party loggers that are chatty at INFO: the Azure SDK's AMQP layer (pyamqp) logs every connection, session and
# link state change (about 190 lines an order in the Agent over AMQP: 9,415 lines for 50 orders), its HTTP and
# identity layers every request; `uamqp.c_uamqp` (the Service Bus SDK-type binding decodes with uamqp) about eight
# INFO lines a message that are not errors. They log at WARNING unless the process runs at DEBUG.
NOISY_LOGGERS = (
    "uamqp",
    "azure.core.pipeline.policies.http_logging_policy",
    "azure.servicebus._pyamqp",
    "azure.servicebus.aio._base_handler_async",
    "azure.servicebus._base_handler",
    "azure.identity",
)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_logging(level: str, fmt: str = LOG_FORMAT) -> None:
    """`logging.basicConfig` at `level`, with NOISY_LOGGERS at WARNING unless `level` is DEBUG."""
    logging.basicConfig(level=level.upper(), format=fmt)
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def configure_from_env(env: Mapping[str, str] | None = None, *, service_name: str | None = None) -> bool:
    """Export to Application Insights when APPLICATIONINSIGHTS_CONNECTION_STRING is set (Azure; identity-based
    ingestion via APPLICATIONINSIGHTS_AUTHENTICATION_STRING), else to the console for each signal whose
    OTEL_<SIGNAL>_EXPORTER is `console`. `service_name` names the process (cloud_RoleName) unless OTEL_SERVICE_NAME
    does. Returns whether an exporter was configured."""
    source = os.environ if env is None else env
    if not source.get("APPLICATIONINSIGHTS_CONNECTION_STRING"):
        return _configure_console(source, service_name)
    from azure.monitor.opentelemetry import configure_azure_monitor

    credential = None
    if "Authorization=AAD" in source.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", ""):
        from azure.identity import ManagedIdentityCredential

        credential = ManagedIdentityCredential(client_id=source.get("AZURE_CLIENT_ID"))
    options: dict[str, Any] = {}
    if service_name and not source.get("OTEL_SERVICE_NAME"):
        options["resource"] = _resource(service_name)
    configure_azure_monitor(credential=credential, logger_name="orderflow", **options)
    return True


def _resource(service_name: str | None) -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    return Resource.create({SERVICE_NAME: service_name} if service_name else {})


def _configure_console(source: Mapping[str, str], service_name: str | None) -> bool:
    """The SDK's console exporters, for the signals whose OTEL_<SIGNAL>_EXPORTER is `console`. The SDK is installed
    wherever the app is (azure-monitor-opentelemetry depends on opentelemetry-sdk)."""
    wanted = {
        signal
        for signal in ("TRACES", "METRICS", "LOGS")
        if CONSOLE in source.get(f"OTEL_{signal}_EXPORTER", "").lower().split(",")
    }
    if not wanted:
        return False
    resource = _resource(None if source.get("OTEL_SERVICE_NAME") else service_name)
    if "TRACES" in wanted:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        trace.set_tracer_provider(tracer_provider)
    if "METRICS" in wanted:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )

        metrics.set_meter_provider(
            MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(ConsoleMetricExporter())])
        )
    if "LOGS" in wanted:
        from opentelemetry._logs import set_logger_provider
        from opentelemetry.instrumentation.logging.handler import LoggingHandler
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter

        logger_provider = LoggerProvider(resource=resource)
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(ConsoleLogRecordExporter()))
        set_logger_provider(logger_provider)
        logging.getLogger("orderflow").addHandler(LoggingHandler(logger_provider=logger_provider))
    return True


def alert_event(kind: str, order_id: str | None, reason: str, details: Mapping[str, str] | None = None) -> None:
    """An operator alert as an OpenTelemetry event: a log record on `orderflow.alerts` whose attributes are the event
    name (`microsoft.custom_event.name` = OrderflowAlert: a customEvents row in Application Insights), `kind`,
    `orderId` (when the alert is about an order), `reason`, and any `details` (an alarm's `alarm`, `queue`,
    `runbook`). Logged at WARNING so that the default level lets it through; the ERROR line that names the alert
    stays on its own logger (orderflow.outbound, agent)."""
    attributes = {**(details or {}), CUSTOM_EVENT_ATTRIBUTE: ALERT_EVENT_NAME, "kind": kind, "reason": reason}
    if order_id is not None:
        attributes["orderId"] = order_id
    log.warning("%s %s", ALERT_EVENT_NAME, kind, extra=attributes)


def _meter() -> metrics.Meter:
    return metrics.get_meter(METER_NAME)


def count_alert(kind: str) -> None:
    _meter().create_counter("orderflow.alerts", unit="1", description="Operator alerts raised").add(1, {"kind": kind})


def count_order_error() -> None:
    _meter().create_counter("orderflow.orders.error", unit="1", description="Orders moved to Error").add(1)


def record_supervisor_scan(request_charge: float, recovered: int, escalated: int) -> None:
    m = _meter()
    m.create_histogram(
        "orderflow.supervisor.request_charge", unit="RU", description="Request charge of one Supervisor scan"
    ).record(request_charge)
    m.create_counter("orderflow.supervisor.recovered", unit="1").add(recovered)
    m.create_counter("orderflow.supervisor.escalated", unit="1").add(escalated)


# The last known state of each remote service's circuit breaker (0 closed, 1 half-open, 2 open), reported by one
# observable gauge: infra/app/alerts.bicep alerts when it reads 2 (open).
_circuit_states: dict[str, int] = {}
_gauges_registered: set[str] = set()


def _observable_gauge(name: str, callback: Any, *, unit: str, description: str) -> None:
    """Create the observable gauge `name` (a literal at every call: tests/support/code_scan.py reads them) once per
    process: it reports what `callback` returns at each collection."""
    if name not in _gauges_registered:
        _meter().create_observable_gauge(name, callbacks=[callback], unit=unit, description=description)
        _gauges_registered.add(name)


def _observer(values: dict[str, Any], attribute: str) -> Any:
    """An observable gauge's callback: one observation of each of `values` as last set, its key as `attribute`."""

    def observe(_options: metrics.CallbackOptions) -> list[metrics.Observation]:
        return [metrics.Observation(value, {attribute: key}) for key, value in sorted(values.items())]

    return observe


def set_circuit_state(service: str, value: int) -> None:
    _circuit_states[service] = value
    _observable_gauge(
        "orderflow.circuit.state",
        _observer(_circuit_states, "service"),
        unit="1",
        description="Circuit breaker state per remote service: 0 closed, 1 half-open, 2 open",
    )


def circuit_states() -> dict[str, int]:
    return dict(_circuit_states)


def count_rejected(reason: str) -> None:
    _meter().create_counter(
        "orderflow.admission.rejected", unit="1", description="Orders refused by admission control"
    ).add(1, {"reason": reason})


# The last counted figures of each observable gauge: orders per state (the Starter's admission refresh counts Pending
# and Processing; the operator summary counts every state) and dead-letter depth per queue. An observable gauge
# reports what its callback returns at each collection, so the figures are kept here between counts.
_orders_in_state: dict[str, int] = {}
_deadletter_depths: dict[str, int] = {}


# Each setter names its instrument literally (tests/product/infra reads the metric names the code creates from the
# calls).
def set_orders_in_state(state: str, count: int) -> None:
    """The last count of orders in `state` (gauge `orderflow.orders.in_state`, attribute `state`)."""
    _orders_in_state[state] = count
    _observable_gauge(
        "orderflow.orders.in_state",
        _observer(_orders_in_state, "state"),
        unit="1",
        description="Orders per ProcessState, as last counted",
    )


def set_deadletter_depth(queue: str, depth: int) -> None:
    """The last count of messages in `queue`'s dead-letter sub-queue (gauge `orderflow.deadletter.depth`)."""
    _deadletter_depths[queue] = depth
    _observable_gauge(
        "orderflow.deadletter.depth",
        _observer(_deadletter_depths, "queue"),
        unit="1",
        description="Messages in each queue's dead-letter sub-queue, as last counted",
    )


def count_order_completed(state: str) -> None:
    """An order reached its terminal `state` (Processed, Error, Compensated, CompensationFailed, Cancelled): counted
    once, by the call that recorded its notification."""
    _meter().create_counter(
        "orderflow.orders.completed", unit="1", description="Orders that reached a terminal state"
    ).add(1, {"state": state})


def record_order_duration(state: str, seconds: float) -> None:
    """createdAt → terminal state of one order (histogram `orderflow.order.duration`, seconds)."""
    _meter().create_histogram(
        "orderflow.order.duration", unit="s", description="Order end-to-end latency: creation to terminal state"
    ).record(seconds, {"state": state})


# The alarms (orderflow/alarms.py): the last evaluation's figures, reported by observable gauges like the ones above.
_alarms_firing: dict[tuple[str, str], int] = {}
_oldest_ages: dict[str, float] = {}
_backlog_growth: dict[str, int] = {}


def _observe_alarms(_options: metrics.CallbackOptions) -> list[metrics.Observation]:
    return [
        metrics.Observation(value, {"alarm": alarm, **({"queue": queue} if queue else {})})
        for (alarm, queue), value in sorted(_alarms_firing.items())
    ]


def _observe_growth(_options: metrics.CallbackOptions) -> list[metrics.Observation]:
    return [metrics.Observation(value) for value in _backlog_growth.values()]


def set_alarm_firing(alarm: str, firing: bool, queue: str | None = None) -> None:
    """Whether `alarm` fires, 1 or 0 (gauge `orderflow.alarm.firing`, attribute `alarm`, and `queue` for the
    dead-letters alarm)."""
    _alarms_firing[(alarm, queue or "")] = int(firing)
    _observable_gauge(
        "orderflow.alarm.firing",
        _observe_alarms,
        unit="1",
        description="1 while the alarm fires, else 0 (orderflow/alarms.py; runbook: README, Operating it)",
    )


def set_oldest_age(state: str, seconds: float) -> None:
    """The age of the oldest order in `state` the alarms watch, Pending (the oldest due one) or Processing, in
    seconds since its last write; 0 when there is none (gauge `orderflow.orders.oldest_age`, attribute `state`)."""
    _oldest_ages[state] = seconds
    _observable_gauge(
        "orderflow.orders.oldest_age",
        _observer(_oldest_ages, "state"),
        unit="s",
        description="Age of the oldest due Pending and of the oldest Processing order, since its last write",
    )


def set_backlog_growth(orders: int) -> None:
    """How much the Pending backlog grew over BacklogGrowthWindowSeconds (gauge `orderflow.backlog.growth`)."""
    _backlog_growth["growth"] = orders
    _observable_gauge(
        "orderflow.backlog.growth",
        _observe_growth,
        unit="1",
        description="Growth of the Pending backlog over BacklogGrowthWindowSeconds (orders; negative: it shrank)",
    )
