"""Integration fixtures: a fresh in-process deployment per test, and the process-wide in-memory metric reader."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from integration_support import Pipeline, open_pipeline
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader


@pytest.fixture
async def pipeline(tmp_path: Path) -> AsyncIterator[Pipeline]:
    deployment = await open_pipeline(tmp_path)
    yield deployment
    await deployment.aclose()


@pytest.fixture(scope="session")
def metric_reader() -> Iterator[InMemoryMetricReader]:
    """The process-wide OpenTelemetry MeterProvider with an in-memory reader (set once per process)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    if metrics.get_meter_provider() is not provider:
        pytest.fail("another MeterProvider was installed first; the metric assertions would be void")
    yield reader
    provider.shutdown()
