"""What the code emits, read from its source (orderflow/ and agent/, by `ast`): the metric names it creates
instruments for, its logging format strings, the registered function names; and the platform metrics Azure Monitor
emits without code. The infra tests compare alerts and the workbook with these."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from orderflow import function_names
from support.bicep_tree import REPO

# Platform metrics Azure Monitor itself emits, per resource type (metricNamespace), that an alert may watch without
# any code emitting them. Each is listed in "Supported metrics for <type>" (learn.microsoft.com/azure/azure-monitor/
# reference/supported-metrics/). Add a name only after checking it there.
PLATFORM_METRICS = {
    "Microsoft.ServiceBus/namespaces": {"ActiveMessages", "DeadletteredMessages", "ScheduledMessages", "Messages"},
}
# The OpenTelemetry Meter methods that create an instrument: their first argument is the metric name.
INSTRUMENT_FACTORIES = {
    "create_counter",
    "create_up_down_counter",
    "create_histogram",
    "create_gauge",
    "create_observable_counter",
    "create_observable_up_down_counter",
    "create_observable_gauge",
    "_observable_gauge",  # orderflow/telemetry.py: an observable gauge created once per process
}
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}
CODE_DIRS = ("orderflow", "agent")


def _calls() -> Iterator[ast.Call]:
    for directory in CODE_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                    yield node


def _first_string(call: ast.Call, keyword: str) -> str | None:
    first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == keyword), None)
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _first_strings(methods: set[str] | frozenset[str], keyword: str) -> set[str]:
    """The literal first argument (or `keyword=`) of every call of one of `methods` in orderflow/ and agent/."""
    return {
        value
        for call in _calls()
        if (call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)) in methods
        and (value := _first_string(call, keyword)) is not None
    }


def emitted_metric_names() -> set[str]:
    """Every metric name the code creates an OpenTelemetry instrument for (orderflow/ and agent/)."""
    return _first_strings(INSTRUMENT_FACTORIES, "name")


def log_formats() -> set[str]:
    """The format string of every logging call in orderflow/ and agent/ (the literal part of a traces message)."""
    return _first_strings(LOG_METHODS, "msg")


def registered_function_names() -> set[str]:
    return {v for k, v in vars(function_names).items() if k.isupper() and isinstance(v, str)}
