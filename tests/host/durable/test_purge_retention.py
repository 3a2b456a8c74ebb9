"""The purge timer's pass (orderflow/retention.py) through the real DurableOrchestrationClient and devhost's HTTP API:
finished instances past the retention are deleted, a running one is never touched.

Conformance source: the extension's purge by filter (HttpApiHandler.HandleDeleteHistoryWithFiltersRequestAsync:
createdTimeFrom required, createdTimeTo, runtimeStatus; 200 with instancesDeleted, 404 when none) and
DurableOrchestrationClient.purge_instance_history_by (404 read as 0 deleted)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orderflow.clock import FakeClock
from orderflow.embedded.store import open_sqlite_stores
from orderflow.retention import Retention, durable_purge, run_purge
from tests.host.durable.harness import Hub

RETENTION = Retention(instances=timedelta(days=30), window=timedelta(hours=1), max_per_call=500, max_calls=64)


@dataclass
class Services:
    state: Any
    clock: FakeClock


async def test_purge_deletes_finished_instances_and_never_a_running_one(hub: Hub, tmp_path: Path) -> None:
    done = [await hub.client.start_new("hello_sequence", f"done-{uuid.uuid4().hex[:6]}", ["x"]) for _ in range(3)]
    for instance in done:
        await hub.wait(instance)
    running = await hub.client.start_new("approval", f"run-{uuid.uuid4().hex[:6]}", {"timeout": 3600})
    await hub.wait(running, "Running")
    _, state = open_sqlite_stores(tmp_path / "store.db")
    services: Any = Services(state, FakeClock(datetime.now(UTC) + timedelta(days=31)))  # everything is past 30 days
    run = await run_purge(services, durable_purge(hub.client), RETENTION)
    assert run.deleted == 3
    assert all([await hub.engine.get_status(i) is None for i in done])
    status = await hub.engine.get_status(running)
    assert status is not None and status["runtimeStatus"] == "Running"  # never touched
    await state.aclose()


async def test_purge_leaves_instances_younger_than_the_retention(hub: Hub, tmp_path: Path) -> None:
    instance = await hub.client.start_new("hello_sequence", f"young-{uuid.uuid4().hex[:6]}", ["x"])
    await hub.wait(instance)
    _, state = open_sqlite_stores(tmp_path / "store.db")
    services: Any = Services(state, FakeClock(datetime.now(UTC) + timedelta(days=29)))
    run = await run_purge(services, durable_purge(hub.client), RETENTION)
    assert run.deleted == 0 and await hub.engine.get_status(instance) is not None
    await state.aclose()
