"""host.json as the published host.json schema and the real host read it, and the timer settings beside it.

Conformance source: the JSON schema for host.json in SchemaStore/schemastore, src/schemas/json/host.json (read at
commit 3b6446ad8a077bac56f4a4796c0b7fd88927fc8e), definition "version-2". The schema is not copied here: each rule
below is the part of it that applies to a section this app uses, restated as an assertion, with the schema path it
comes from. Where the schema lags the extension (durableTask.storageProvider lists no "type"), host.json simply
leaves the key out and relies on the extension's default.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devhost.config import ConfigError, HostConfig
from devhost.timers import should_disable_schedule_monitor
from orderflow import settings

ROOT = Path(__file__).resolve().parents[3]
HOST_JSON: dict[str, Any] = json.loads((ROOT / "host.json").read_text())

# definitions/version-2/properties (additionalProperties: false; required: ["version"]).
VERSION_2_KEYS = {
    "extensionBundle",
    "aggregator",
    "functions",
    "functionTimeout",
    "healthMonitor",
    "languageWorker",
    "logging",
    "managedDependency",
    "retry",
    "customHandler",
    "singleton",
    "watchDirectories",
    "watchFiles",
    "version",
    "extensions",
    "concurrency",
    "sendCanceledInvocationsToWorker",
    "telemetryMode",
    "configurationProfile",
}
# .../logging/properties/logLevel: "default" and every other category take this enum.
LOG_LEVELS = {"Critical", "Debug", "Error", "Information", "None", "Trace", "Warning"}
# .../extensions/properties (additionalProperties: false).
EXTENSION_KEYS = {"http", "queues", "sendGrid", "serviceBus", "eventHubs", "durableTask", "cosmosDB", "blobs", "mcp"}
# .../extensions/serviceBus/oneOf[0]: the Service Bus extension 4.x keys; oneOf[1]: 5.x (additionalProperties: false).
SERVICE_BUS_V4_KEYS = {"prefetchCount", "messageHandlerOptions", "sessionHandlerOptions", "batchOptions"}
SERVICE_BUS_V5_KEYS = {
    "clientRetryOptions",
    "prefetchCount",
    "transportType",
    "webProxy",
    "autoCompleteMessages",
    "maxAutoLockRenewalDuration",
    "maxConcurrentCalls",
    "maxConcurrentSessions",
    "maxMessageBatchSize",
    "minMessageBatchSize",
    "maxBatchWaitTime",
    "sessionIdleTimeout",
    "enableCrossEntityTransactions",
}
SERVICE_BUS_V5_INTEGERS = {
    "prefetchCount",
    "maxConcurrentCalls",
    "maxConcurrentSessions",
    "maxMessageBatchSize",
    "minMessageBatchSize",
}
SERVICE_BUS_V5_BOOLEANS = {"autoCompleteMessages", "enableCrossEntityTransactions"}
RETRY_KEYS = {"mode", "tryTimeout", "delay", "maxDelay", "maxRetries"}
RETRY_MODES = {"exponential", "fixed"}  # clientRetryOptions.mode enum: lowercase only
# The schema's TimeSpan patterns: whole seconds "hh:mm:ss" for every Service Bus duration except
# clientRetryOptions.delay, which is "hh:mm:ss.ff" (exactly two fraction digits).
HH_MM_SS = re.compile(r"^(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d$")
HH_MM_SS_FF = re.compile(r"^(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d\d$")
SERVICE_BUS_TIMESPANS = {"maxAutoLockRenewalDuration", "maxBatchWaitTime", "sessionIdleTimeout"}
# definitions/durableTask-extension/properties (additionalProperties: false) and its storageProvider's.
DURABLE_KEYS = {
    "hubName",
    "storageProvider",
    "tracing",
    "notifications",
    "maxConcurrentActivityFunctions",
    "maxConcurrentOrchestratorFunctions",
    "extendedSessionsEnabled",
    "extendedSessionIdleTimeoutInSeconds",
    "useAppLease",
    "useGracefulShutdown",
    "maxEntityOperationBatchSize",
    "useTablePartitionManagement",
    # Not in the schema at that commit (it lags the extension): DurableTaskOptions.DefaultVersion, orchestration
    # versioning in Microsoft.Azure.WebJobs.Extensions.DurableTask 3.1+ (bundle 4.x); docs/devhost.md, Versioning.
    "defaultVersion",
}
STORAGE_PROVIDER_KEYS = {
    "connectionStringName",
    "controlQueueBatchSize",
    "controlQueueBufferThreshold",
    "controlQueueVisibilityTimeout",
    "maxQueuePollingInterval",
    "partitionCount",
    "trackingStoreConnectionStringName",
    "trackingStoreNamePrefix",
    "useLegacyPartitionManagement",
    "workItemQueueVisibilityTimeout",
}


def test_top_level_is_schema_version_2() -> None:
    assert set(HOST_JSON) <= VERSION_2_KEYS, set(HOST_JSON) - VERSION_2_KEYS
    assert HOST_JSON["version"] == "2.0"  # const
    assert HOST_JSON["telemetryMode"] == "OpenTelemetry"  # const
    assert set(HOST_JSON["extensionBundle"]) <= {"id", "version"}  # additionalProperties: false


def test_log_levels_are_in_the_schema_enum() -> None:
    assert set(HOST_JSON["logging"]) <= {"applicationInsights", "fileLoggingMode", "logLevel"}
    levels = HOST_JSON["logging"]["logLevel"]
    assert levels and set(levels.values()) <= LOG_LEVELS, set(levels.values()) - LOG_LEVELS


def test_extensions_are_known_sections() -> None:
    assert set(HOST_JSON["extensions"]) <= EXTENSION_KEYS


def test_service_bus_matches_exactly_one_branch_of_the_schema() -> None:
    sb = HOST_JSON["extensions"]["serviceBus"]
    assert not set(sb) <= SERVICE_BUS_V4_KEYS  # oneOf: it must not also be a valid 4.x section
    assert set(sb) <= SERVICE_BUS_V5_KEYS, set(sb) - SERVICE_BUS_V5_KEYS
    for key in SERVICE_BUS_V5_INTEGERS & set(sb):
        assert type(sb[key]) is int, key
    for key in SERVICE_BUS_V5_BOOLEANS & set(sb):
        assert type(sb[key]) is bool, key
    for key in SERVICE_BUS_TIMESPANS & set(sb):
        assert HH_MM_SS.match(sb[key]), f"{key}={sb[key]!r} does not match the schema's hh:mm:ss"


def test_session_idle_timeout_is_in_a_format_the_schema_accepts() -> None:
    timeout = HOST_JSON["extensions"]["serviceBus"]["sessionIdleTimeout"]
    assert HH_MM_SS.match(timeout)
    assert not HH_MM_SS.match("00:00:00.5")  # the old value: TimeSpan.Parse takes it, the schema does not
    # devhost reads it as the host's TimeSpan.Parse does.
    assert HostConfig.load(ROOT).service_bus_options().session_idle_timeout_s == 1.0


def test_client_retry_options_use_the_schema_spelling() -> None:
    retry = HOST_JSON["extensions"]["serviceBus"]["clientRetryOptions"]
    assert set(retry) <= RETRY_KEYS
    assert retry["mode"] in RETRY_MODES  # lowercase: "Exponential" is not in the enum
    assert HH_MM_SS.match(retry["tryTimeout"]) and HH_MM_SS.match(retry["maxDelay"])
    assert HH_MM_SS_FF.match(retry["delay"])
    assert type(retry["maxRetries"]) is int


def test_default_version_is_the_scheduler_workflow_version() -> None:
    """New instances get the Scheduler's current workflow version (orderflow/workflow.py); a literal, because the
    extension does not expand %VAR% references in defaultVersion (azure-functions-durable-extension #3279)."""
    from orderflow.workflow import WORKFLOW_VERSION

    assert HOST_JSON["extensions"]["durableTask"]["defaultVersion"] == WORKFLOW_VERSION


def test_durable_task_uses_only_schema_keys() -> None:
    durable = HOST_JSON["extensions"]["durableTask"]
    assert set(durable) <= DURABLE_KEYS, set(durable) - DURABLE_KEYS
    assert set(durable.get("storageProvider", {})) <= STORAGE_PROVIDER_KEYS
    for key in ("maxConcurrentActivityFunctions", "maxConcurrentOrchestratorFunctions"):
        assert type(durable[key]) is int
    # No storageProvider.connectionName (not a schema key, and a Durable Task Scheduler override could not remove it;
    # tests/product/infra/test_infra_settings.py checks the merged section).
    assert "connectionName" not in durable.get("storageProvider", {})


@pytest.mark.parametrize("value", ["00:00:00.5", "Exponential", "1s"])
def test_the_checks_reject_the_old_and_wrong_spellings(value: str) -> None:
    assert not HH_MM_SS.match(value) and value not in RETRY_MODES


# ---- timers: useMonitor as the timer extension sets it -------------------------------------------------------------

T0 = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "disabled"),
    [
        # azure-webjobs-sdk-extensions TimerScheduleTests.ShouldDisableScheduleMonitor_ReturnsExpectedValue.
        ("* * * * * *", True),
        ("*/5 * * * * *", True),
        ("10,20,45 * * * * *", True),
        ("0 */5 * * * *", False),
        ("0 30 * * * *", False),
        ("* 30 * * * *", False),
        ("* */30 * * * *", False),
        ("0 * * * * *", False),
        ("30 * * * * *", False),
        ("* 1-5 * * * *", False),
        ("* * 12 * * Mon", False),
    ],
)
def test_devhost_disables_the_monitor_where_the_extension_does(schedule: str, disabled: bool) -> None:
    assert should_disable_schedule_monitor(schedule, T0) is disabled


def timer_decorators() -> dict[str, dict[str, Any]]:
    """Every `@bp.timer_trigger(...)` in triggers/, keyword arguments by file (read with ast: importing the app a
    second time in one process would register its blueprints twice)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((ROOT / "triggers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "timer_trigger":
                found[path.name] = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    return found


def test_sub_minute_timers_say_use_monitor_false() -> None:
    # TimerSchedule.Create (azure-webjobs-sdk-extensions) sets UseMonitor = false for a sub-minute schedule whatever
    # the function says, so use_monitor=True on one would only claim persistence that Azure never provides.
    timers = timer_decorators()
    assert {"starter.py", "supervisor.py", "retention.py"} <= set(timers)
    for name, kwargs in timers.items():
        schedule = settings.get(kwargs["schedule"].strip("%"), env={})
        assert schedule is not None
        if should_disable_schedule_monitor(schedule, T0):
            assert kwargs.get("use_monitor") is False, name
    # The Starter's and the Supervisor's default schedules are sub-minute, so both must say so.
    assert all(
        should_disable_schedule_monitor(settings.get(timers[t]["schedule"].strip("%"), env={}) or "", T0)
        for t in ("starter.py", "supervisor.py")
    )


# ---- devhost reads host.json TimeSpans as the host's configuration binder does (TimeSpan.Parse) --------------------


def _service_bus(tmp_path: Path, section: dict[str, Any]) -> Any:
    (tmp_path / "host.json").write_text(json.dumps({"version": "2.0", "extensions": {"serviceBus": section}}))
    return HostConfig.load(tmp_path).service_bus_options()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("00:00:01", 1.0), ("00:00:00.5", 0.5), ("00:30", 1800.0), ("1.02:00:00", 93600.0), ("2", 172800.0)],
)
def test_devhost_parses_timespans_as_timespan_parse(tmp_path: Path, value: str, seconds: float) -> None:
    # learn.microsoft.com/dotnet/api/system.timespan.parse: [d.]hh:mm[:ss[.ff]] or d; "00:30" is half an hour.
    assert _service_bus(tmp_path, {"sessionIdleTimeout": value}).session_idle_timeout_s == seconds


@pytest.mark.parametrize("value", ["00:00:60", "24:00:00", "1s", "half a second"])
def test_devhost_refuses_what_the_host_cannot_bind(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError):
        _service_bus(tmp_path, {"sessionIdleTimeout": value})


def test_devhost_refuses_an_unknown_retry_mode_and_takes_either_case(tmp_path: Path) -> None:
    # ServiceBusRetryMode {Fixed, Exponential}: the binder parses enum names ignoring case.
    assert _service_bus(tmp_path, {"clientRetryOptions": {"mode": "Exponential"}})
    assert _service_bus(tmp_path, {"clientRetryOptions": {"mode": "fixed"}})
    with pytest.raises(ConfigError):
        _service_bus(tmp_path, {"clientRetryOptions": {"mode": "linear"}})


def test_devhost_session_idle_timeout_defaults_to_the_try_timeout(tmp_path: Path) -> None:
    # ServiceBusOptions.SessionIdleTimeout: "If not specified, the ServiceBusRetryOptions.TryTimeout will be used."
    assert _service_bus(tmp_path, {}).session_idle_timeout_s == 60.0
    assert _service_bus(tmp_path, {"clientRetryOptions": {"tryTimeout": "00:00:20"}}).session_idle_timeout_s == 20.0


# ---- durableTask.storageProvider.maxQueuePollingInterval ----------------------------------------------------------


def _durable(tmp_path: Path, provider: dict[str, Any]) -> Any:
    section = {"durableTask": {"storageProvider": provider}}
    (tmp_path / "host.json").write_text(json.dumps({"version": "2.0", "extensions": section}))
    return HostConfig.load(tmp_path, environ={}).durable_options()


def test_max_queue_polling_interval_is_a_whole_second_timespan_devhost_reads() -> None:
    value = HOST_JSON["extensions"]["durableTask"]["storageProvider"]["maxQueuePollingInterval"]
    assert HH_MM_SS.match(value)
    assert HostConfig.load(ROOT, environ={}).durable_options().max_queue_polling_interval_s == 5.0


def test_devhost_takes_the_providers_default_polling_and_refuses_zero(tmp_path: Path) -> None:
    # AzureStorageOptions.MaxQueuePollingInterval defaults to 30 s; AzureStorageOptions.Validate throws for <= 0
    # ("MaxQueuePollingInterval must be non-negative"), which stops the host.
    assert _durable(tmp_path, {}).max_queue_polling_interval_s == 30.0
    assert _durable(tmp_path, {"MaxQueuePollingInterval": "00:00:02"}).max_queue_polling_interval_s == 2.0
    for bad in ("00:00:00", "-00:00:05", "5s"):
        with pytest.raises(ConfigError):
            _durable(tmp_path, {"maxQueuePollingInterval": bad})
