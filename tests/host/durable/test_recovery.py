"""Crash recovery: an engine stopped mid-flight leaves its work persisted; the next engine on the db finishes
it.

Activity delivery is at-least-once: the work item is persisted before it runs and removed only in the
transaction that records its result, so an activity interrupted by a stop runs again after restart.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from datetime import timedelta

from azure.durable_functions.models.actions.ActionType import ActionType as A
from azure.durable_functions.models.history import HistoryEventType as T

from tests.host.durable.harness import WAIT, HubFactory, ManualClock
from tests.host.sample_app.function_app import ATTEMPTS, GATES


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


async def test_an_instance_recorded_before_the_journal_continues(hubs: HubFactory) -> None:
    """A state dir written by an older devhost: the whole bookkeeping in the instances row's `state` column, a
    with-retry group holding its call and attempt count, no journal rows. It waits on its retry timer here."""
    clock = ManualClock()
    first = await hubs.start(clock=clock)
    key = f"old-{uuid.uuid4().hex[:8]}"
    spec = {"key": key, "fail_times": 1, "interval_ms": 100, "max_attempts": 3}
    instance_id = await first.client.start_new("retrying", f"rec-{key}", spec)
    await first.engine.wait_for_history(instance_id, lambda h: any(e["EventType"] == T.TIMER_CREATED for e in h), WAIT)
    await hubs.stop(first)
    with sqlite3.connect(hubs.db_path) as db:
        (call,) = [
            json.loads(e)
            for (e,) in db.execute("SELECT event FROM history WHERE instance_id=?", (instance_id,))
            if json.loads(e)["EventType"] == T.TASK_SCHEDULED
        ]
        old_state = {
            "next_seq": 2,
            "recorded": [{"kind": int(A.CALL_ACTIVITY_WITH_RETRY), "name": "flaky"}],
            "groups": {
                "0": {
                    "kind": int(A.CALL_ACTIVITY_WITH_RETRY),
                    "name": call["Name"],
                    "input": call["Input"],
                    "instance_id": f"{instance_id}:0000",
                    "attempt": 1,
                    "retry": {"firstRetryIntervalInMilliseconds": 100, "maxNumberOfAttempts": 3},
                }
            },
            "tasks": {"0": {"group": "0", "role": "call"}, "1": {"group": "0", "role": "timer"}},
        }
        db.execute("UPDATE instances SET state=? WHERE instance_id=?", (json.dumps(old_state), instance_id))
        db.execute("DELETE FROM journal WHERE instance_id=?", (instance_id,))

    clock.now += timedelta(seconds=1)  # the retry timer is due when the next engine starts
    second = await hubs.start(clock=clock)
    status = await second.wait(instance_id)
    assert status["output"] == {"key": key, "attempts": 2}
    scheduled = [e for e in second.engine.store.history(instance_id) if e["EventType"] == T.TASK_SCHEDULED]
    assert [(e["EventId"], e["Name"], e["Input"]) for e in scheduled] == [
        (0, "flaky", json.dumps(spec)),
        (2, "flaky", json.dumps(spec)),
    ]
