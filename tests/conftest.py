"""Suite-wide fixtures. OpenTelemetry allows one global MeterProvider per process: it is installed here, once, with
an in-memory reader that tests read through the `metric_points` fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

METRIC_READER = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[METRIC_READER]))


def read_metric_points() -> dict[str, list[object]]:
    """Every data point collected so far, by metric name (cumulative since the start of the session)."""
    data = METRIC_READER.get_metrics_data()
    out: dict[str, list[object]] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


@pytest.fixture()
def metric_points() -> Callable[[], dict[str, list[object]]]:
    return read_metric_points


@pytest.fixture
async def p(tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh in-process deployment (tests/support/integration_support.py) whose Services the activities' and
    triggers' get_services() return on this loop."""
    from support.integration_support import open_pipeline  # only the tests that use it pay

    from orderflow import runtime

    deployment = await open_pipeline(tmp_path)
    runtime.use_services(deployment.services)
    yield deployment
    runtime.reset_services()
    await deployment.aclose()
