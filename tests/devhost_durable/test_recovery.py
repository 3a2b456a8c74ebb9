"""Crash recovery: an engine stopped mid-flight leaves its work persisted; the next engine on the db finishes
it.

Activity delivery is at-least-once: the work item is persisted before it runs and removed only in the
transaction that records its result, so an activity interrupted by a stop runs again after restart.
"""

from __future__ import annotations

import threading
import uuid

from tests.devhost_durable.harness import WAIT, HubFactory
from tests.sample_app.function_app import ATTEMPTS, GATES


async def test_unfinished_activity_runs_again_after_restart(hubs: HubFactory) -> None:
    key = f"gate-{uuid.uuid4().hex[:8]}"
    gate = GATES.setdefault(key, threading.Event())
    first = await hubs.start()
    instance_id = await first.client.start_new("waits_on_gate", f"rec-{key}", key)
    await first.engine.wait_for_history(instance_id, lambda h: any(e["EventType"] == 4 for e in h), WAIT)
    assert first.engine.store.pending_work()  # persisted before/while it runs
    await hubs.stop(first)  # the activity is still blocked on its gate: its result is never recorded
    assert ATTEMPTS.get(key, 0) <= 1

    gate.set()
    second = await hubs.start()
    status = await second.wait(instance_id)
    assert status["output"] == f"ran {key}"
    assert ATTEMPTS[key] >= 1
    assert second.engine.store.pending_work() == []


async def test_pending_timer_and_waiting_instance_survive_restart(hubs: HubFactory) -> None:
    first = await hubs.start()
    instance_id = await first.client.start_new("approval", f"rec-{uuid.uuid4().hex[:8]}", {"timeout": 0.4})
    await first.engine.wait_for_history(instance_id, lambda h: any(e["EventType"] == 10 for e in h), WAIT)
    await hubs.stop(first)
    second = await hubs.start()
    status = await second.wait(instance_id)
    assert status["output"] == "timeout"
