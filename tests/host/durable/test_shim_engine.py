"""The extension's replay rules through devhost's engine, the real SDK and its client (devhost/durable/shim.py).

Each orchestrator below does something the Python SDK accepts and Azure does not carry out as the SDK says; the
source of each rule is in its test (tests/host/durable/test_shim.py has them one by one). Timers run on a ManualClock
that only the test moves; an activity that must wait is held by an asyncio event (it runs on the test's loop).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import azure.durable_functions as df
import pytest
from azure.durable_functions.models.history.HistoryEventType import HistoryEventType as H

from tests.host.durable.harness import WAIT, Hub, HubFactory, ManualClock

app = df.DFApp()
HELD: dict[str, asyncio.Event] = {}


@app.activity_trigger(input_name="name")
async def hello(name: str) -> str:
    return f"hello {name}"


@app.activity_trigger(input_name="key")
async def held(key: str) -> str:
    await asyncio.wait_for(HELD.setdefault(key, asyncio.Event()).wait(), WAIT)
    return key


@app.activity_trigger(input_name="key")
async def failing(key: str) -> str:
    raise RuntimeError(f"{key} failed")


@app.orchestration_trigger(context_name="context")
def leaves_its_timer(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """The event wins the race and the timer is not cancelled."""
    timer = context.create_timer(context.current_utc_datetime + timedelta(seconds=60))
    winner = yield context.task_any([context.wait_for_external_event("E"), timer])
    return "event" if winner is not timer else "timer"


@app.orchestration_trigger(context_name="context")
def waits_again_on_its_timer(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """The first event is ignored and the wait goes on, on the same timer: the second WhenAny holds the wait only."""
    timer = context.create_timer(context.current_utc_datetime + timedelta(seconds=60))
    winner = yield context.task_any([context.wait_for_external_event("E"), timer])
    if winner is not timer:
        winner = yield context.task_any([context.wait_for_external_event("E"), timer])
    return "timer" if winner is timer else "event"


@app.orchestration_trigger(context_name="context")
def calls_a_missing_activity(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    return (yield context.call_activity("no_such_activity", "x"))


@app.orchestration_trigger(context_name="context")
def moves_on_after_a_failure(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """task_all fails at its first failed child; the orchestrator catches it and calls the next activity at once."""
    key = context.get_input()
    try:
        yield context.task_all([context.call_activity("failing", key), context.call_activity("held", key)])
    except Exception:  # noqa: BLE001
        pass
    return (yield context.call_activity("hello", key))


FUNCTIONS = app.get_functions()


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[tuple[Hub, ManualClock]]:
    factory = HubFactory(tmp_path / "durable.db")
    clock = ManualClock()
    try:
        yield await factory.start(functions=FUNCTIONS, clock=clock), clock
    finally:
        await factory.close()


def count(events: list[dict[str, Any]], kind: H) -> int:
    return sum(1 for e in events if e["EventType"] == kind)


async def until(hub: Hub, instance_id: str, predicate: Any) -> list[dict[str, Any]]:
    return await hub.engine.wait_for_history(instance_id, predicate, WAIT)


async def runtime_status(hub: Hub, instance_id: str) -> str:
    return str((await hub.engine.get_status(instance_id) or {}).get("runtimeStatus"))


async def test_a_timer_left_open_keeps_the_instance_running_until_it_fires(system: tuple[Hub, ManualClock]) -> None:
    # DurableTask.Core TaskOrchestrationExecutor.ExecuteCore completes an orchestration only `if
    # (!this.context.HasOpenTasks)`; learn.microsoft.com durable-functions-timers: "the orchestration won't complete
    # until ... timers are either completed or canceled".
    hub, clock = system
    instance_id = await hub.client.start_new("leaves_its_timer", f"open-{uuid.uuid4().hex[:8]}")
    await until(hub, instance_id, lambda e: count(e, H.TIMER_CREATED) == 1)
    await hub.client.raise_event(instance_id, "E", 1)
    await until(hub, instance_id, lambda e: count(e, H.EVENT_RAISED) == 1)
    assert await runtime_status(hub, instance_id) == "Running"  # the SDK returned "event"
    clock.advance(hub, 61)
    status = await hub.wait(instance_id)
    assert (status["runtimeStatus"], status["output"]) == ("Completed", "event")


async def test_a_second_wait_on_a_timer_already_raced_never_sees_it_fire(
    system: tuple[Hub, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    # OutOfProcOrchestrationShim: the second WhenAny's compoundActions hold only the new wait (the SDK leaves scheduled
    # children out: models/Task.py CompoundTask.__init__), and ProcessAsyncActionsV2 awaits it before anything ends.
    hub, clock = system
    instance_id = await hub.client.start_new("waits_again_on_its_timer", f"again-{uuid.uuid4().hex[:8]}")
    await until(hub, instance_id, lambda e: count(e, H.TIMER_CREATED) == 1)
    await hub.client.raise_event(instance_id, "E", 1)
    await until(hub, instance_id, lambda e: count(e, H.EVENT_RAISED) == 1)
    with caplog.at_level(logging.WARNING, logger="devhost.durable"):
        clock.advance(hub, 61)
        await until(hub, instance_id, lambda e: count(e, H.TIMER_FIRED) == 1)
    assert await runtime_status(hub, instance_id) == "Running"  # the SDK returned "timer"
    assert "returned (done), but the extension's replay of its actions waits for" in caplog.text
    await hub.client.raise_event(instance_id, "E", 2)
    status = await hub.wait(instance_id)
    assert (status["runtimeStatus"], status["output"]) == ("Completed", "timer")


async def test_a_call_to_a_function_that_does_not_exist_hangs(
    system: tuple[Hub, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    # DurableOrchestrationContext.CallDurableTaskFunctionAsync (async) throws ThrowIfFunctionDoesNotExist into its task;
    # the shim swallows it: no TaskScheduled, no failure (azure-functions-durable-python #132, open).
    hub, _ = system
    with caplog.at_level(logging.WARNING, logger="devhost.durable"):
        instance_id = await hub.client.start_new("calls_a_missing_activity", f"missing-{uuid.uuid4().hex[:8]}")
        events = await until(hub, instance_id, lambda e: count(e, H.ORCHESTRATOR_COMPLETED) == 1)
    assert count(events, H.TASK_SCHEDULED) == 0
    assert await runtime_status(hub, instance_id) == "Running"
    assert "calls 'no_such_activity', which is not a registered function of that kind" in caplog.text


async def test_after_a_failure_in_task_all_the_next_call_waits_for_the_other_children(
    system: tuple[Hub, ManualClock],
) -> None:
    # The SDK's task_all fails at the first failure (models/Task.py WhenAllTask.try_set_value); the shim awaits
    # Task.WhenAll, which completes only when every child has, so the next call is scheduled after `held` returns.
    hub, _ = system
    key = f"all-{uuid.uuid4().hex[:8]}"
    HELD[key] = asyncio.Event()
    instance_id = await hub.client.start_new("moves_on_after_a_failure", key, key)
    events = await until(hub, instance_id, lambda e: count(e, H.TASK_FAILED) == 1)
    assert [e["Name"] for e in events if e["EventType"] == H.TASK_SCHEDULED] == ["failing", "held"]
    HELD[key].set()
    status = await hub.wait(instance_id)
    assert status["output"] == f"hello {key}", status
    events = hub.engine.store.history(instance_id)
    order = [(e["EventType"], e.get("Name") or e.get("TaskScheduledId")) for e in events]
    assert order.index((H.TASK_SCHEDULED, "hello")) > order.index((H.TASK_COMPLETED, 1))
