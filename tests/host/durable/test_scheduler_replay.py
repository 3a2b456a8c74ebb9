"""The Scheduler's race as the extension replays it (devhost/durable/shim.py): issue 24's two cases from a review with
the real SDK, reproduced through devhost's engine, the real `order_workflow` and the real SDK client.

Why the race can block on Azure. The extension does not carry out the SDK's action list: OutOfProcOrchestrationShim
(azure-functions-durable-extension, Listener/OutOfProcOrchestrationShim.cs `ProcessAsyncActionsV2`) awaits each
action in order, and a WhenAny replays only its `compoundActions`, which hold the children the SDK had not scheduled
before (azure/durable_functions/models/Task.py `CompoundTask.__init__` skips `_is_scheduled` children). The race's
second wait after an ignored reply is therefore `WhenAny(WaitForExternalEvent reply)` alone: the timer and the cancel
were scheduled with the first wait. When the timer or the cancel wins that second wait, the SDK moves on, but the
shim still awaits a reply, and an instance whose action list is not replayed to its end never completes
(`HandleDurableTaskReplay`: `Task.Delay(Timeout.Infinite)`). A cancelled timer is what lets the shim pass a WhenAny
whose winner it does not hold: `TimerTask.cancel` sets the action's `isCanceled`, and `InvokeAPIFromAction` cancels
the timer's token at once (DurableTask.Core `CreateTimer`: the task ends Canceled), so the WhenAny completes.

Case (a): an ignored reply, then the deadline. Version 3 (frozen) stays Running, as on Azure, until another reply
comes; the live version waits again with a fresh timer (orchestrators/scheduling.py `race`). An ignored reply then
the cancel does not block version 3 (see its test), and the live version does not rely on why.
Case (b): a cancel during the second step, whose race does not hold the cancel wait (scheduled in the first step's):
only the `timer.cancel()` of the cancel branch lets the shim reach the next decision.

Stub activities (ADVANCE_ORDER answers what the test scripts); timers on a ManualClock that only the test moves.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import azure.durable_functions as df
import pytest
from azure.durable_functions.models.history.HistoryEventType import HistoryEventType as H

from orchestrators import order_workflow
from orderflow import function_names as fn
from orderflow.messages import STEPS, reply_event_name
from orderflow.workflow import CANCEL_EVENT, WORKFLOW_VERSION
from tests.host.durable.harness import WAIT, Hub, HubFactory, ManualClock

RESERVE, CHARGE = STEPS[0].value, STEPS[1].value
RELEASE = "release-inventory"
STEP_TIMEOUT = 60
FROZEN_V3 = "3.0"

stubs = df.Blueprint()
SCRIPT: dict[str, list[dict[str, Any] | None]] = {}  # instance id → ADVANCE_ORDER's answers, in order
CALLS: dict[str, list[dict[str, Any]]] = {}  # instance id → ADVANCE_ORDER's requests


@stubs.function_name(fn.ADVANCE_ORDER)
@stubs.activity_trigger(input_name="request")
async def advance_order(request: dict) -> dict | None:
    CALLS.setdefault(request["instanceId"], []).append(request)
    return SCRIPT[request["instanceId"]].pop(0)


_app = df.DFApp()
_app.register_functions(order_workflow.bp)
_app.register_functions(stubs)
FUNCTIONS = _app.get_functions()


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[tuple[Hub, ManualClock]]:
    factory = HubFactory(tmp_path / "durable.db")
    clock = ManualClock()
    try:
        yield await factory.start(functions=FUNCTIONS, clock=clock), clock
    finally:
        await factory.close()


def reply(instance_id: str, step: str, **overrides: Any) -> dict[str, Any]:
    """A reply as the Agent sends it and triggers/agent_replies.py raises it."""
    order_id, attempt = instance_id.rsplit(":", 1)
    body = {
        "schemaVersion": 2 if step == RELEASE else 1,
        "type": "AgentReply",
        "instanceId": instance_id,
        "orderId": order_id,
        "attempt": int(attempt),
        "step": step,
        "outcome": "succeeded",
        "permanent": False,
        "errorCode": None,
        "error": None,
        "result": {"undone": True} if step == RELEASE else {"ok": True},
        "completedAt": "2026-01-01T00:00:01Z",
    }
    return {**body, **overrides}


def count(events: list[dict[str, Any]], kind: H, name: str | None = None) -> int:
    return sum(1 for e in events if e["EventType"] == kind and (name is None or e.get("Name") == name))


def scheduled_by_the_episode_of(events: list[dict[str, Any]], kind: H, name: str) -> list[str]:
    """What the episode that took the last `kind` event named `name` scheduled (TaskScheduled names, in order)."""
    at = max(i for i, e in enumerate(events) if e["EventType"] == kind and e.get("Name", name) == name)
    end = next(i for i in range(at, len(events)) if events[i]["EventType"] == H.ORCHESTRATOR_COMPLETED)
    return [e["Name"] for e in events[at:end] if e["EventType"] == H.TASK_SCHEDULED]


async def until(hub: Hub, instance_id: str, what: str, predicate: Any) -> list[dict[str, Any]]:
    try:
        return await hub.engine.wait_for_history(instance_id, predicate, WAIT)
    except TimeoutError:
        status = await hub.engine.get_status(instance_id) or {}
        raise AssertionError(f"timed out waiting for {what}: {status.get('runtimeStatus')}") from None


async def start(hub: Hub, version: str, answers: list[dict[str, Any] | None]) -> str:
    instance_id = f"rep-{uuid.uuid4().hex[:8]}:1"
    SCRIPT[instance_id] = list(answers)
    order_id = instance_id.rsplit(":", 1)[0]
    spec = {"orderId": order_id, "attempt": 1, "stepTimeoutSeconds": STEP_TIMEOUT, "workflowVersion": version}
    await hub.client.start_new(fn.ORDER_WORKFLOW, instance_id, spec)
    await until(hub, instance_id, "the first race", lambda e: count(e, H.TIMER_CREATED) == 1)
    return instance_id


async def ignore_one_reply(hub: Hub, instance_id: str) -> None:
    """A reply of another attempt, under the first step's event name: the Scheduler ignores it and waits again."""
    order_id = instance_id.rsplit(":", 1)[0]
    await hub.client.raise_event(instance_id, reply_event_name(RESERVE), reply(f"{order_id}:7", RESERVE))
    await until(hub, instance_id, "the ignored reply", lambda e: count(e, H.EVENT_RAISED) == 1)


# ---- case (a): an ignored reply, then the deadline ----------------------------------------------------------------


async def test_after_an_ignored_reply_the_deadline_ends_the_attempt(system: tuple[Hub, ManualClock]) -> None:
    hub, clock = system
    instance_id = await start(hub, WORKFLOW_VERSION, [{"send": RESERVE}])
    await ignore_one_reply(hub, instance_id)
    clock.advance(hub, STEP_TIMEOUT + 1)
    status = await hub.engine.wait_for_status(instance_id, ("Completed", "Failed"), WAIT)
    assert status["output"] == {"outcome": "timedOut", "step": RESERVE}, status


async def test_version_3_after_an_ignored_reply_stays_running_past_the_deadline_as_on_azure(
    system: tuple[Hub, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    hub, clock = system
    instance_id = await start(hub, FROZEN_V3, [{"send": RESERVE}])
    await ignore_one_reply(hub, instance_id)
    with caplog.at_level(logging.WARNING, logger="devhost.durable"):
        clock.advance(hub, STEP_TIMEOUT + 1)
        await until(hub, instance_id, "the deadline's episode", lambda e: count(e, H.TIMER_FIRED) >= 1)
    # The SDK returned (timedOut), but the shim awaits the second wait, a reply, forever.
    assert (await hub.engine.get_status(instance_id) or {})["runtimeStatus"] == "Running"
    assert "waits for WhenAny(WaitForExternalEvent 'AgentReply:reserve-inventory')" in caplog.text
    # Only another reply on that name lets it end, with what the SDK had decided at the deadline.
    await hub.client.raise_event(instance_id, reply_event_name(RESERVE), reply(instance_id, RESERVE))
    status = await hub.engine.wait_for_status(instance_id, ("Completed", "Failed"), WAIT)
    assert status["output"] == {"outcome": "timedOut", "step": RESERVE}, status


# ---- case (a): an ignored reply, then the cancel ------------------------------------------------------------------


async def test_after_an_ignored_reply_the_cancel_reaches_the_next_decision(system: tuple[Hub, ManualClock]) -> None:
    hub, _ = system
    instance_id = await start(hub, WORKFLOW_VERSION, [{"send": RESERVE}, {"send": RELEASE}, {"done": "Cancelled"}])
    await ignore_one_reply(hub, instance_id)
    await hub.client.raise_event(instance_id, CANCEL_EVENT, {"orderId": instance_id.rsplit(":", 1)[0]})
    events = await until(hub, instance_id, "the cancel", lambda e: count(e, H.EVENT_RAISED, CANCEL_EVENT) == 1)
    assert scheduled_by_the_episode_of(events, H.EVENT_RAISED, CANCEL_EVENT) == [fn.ADVANCE_ORDER]
    await until(hub, instance_id, "the compensation's race", lambda e: count(e, H.TASK_COMPLETED) == 2)
    assert CALLS[instance_id][1]["cancel"] is True
    await hub.client.raise_event(instance_id, reply_event_name(RELEASE), reply(instance_id, RELEASE))
    status = await hub.engine.wait_for_status(instance_id, ("Completed", "Failed"), WAIT)
    assert status["output"] == {"outcome": "cancelled"}, status


async def test_version_3_after_an_ignored_reply_sees_the_cancel_through_the_cancelled_timer(
    system: tuple[Hub, ManualClock],
) -> None:
    """Version 3's second wait holds only a reply, yet the cancel gets through: the SDK cancels the first wait's timer,
    so the replay passes the first WhenAny at once; the second one's wait is then the newest waiter of the reply name,
    and the extension hands an event to the newest waiter (DurableOrchestrationContext.WaitForExternalEvent: "a
    stack ... to make it easier for users to abandon external events"), so the ignored reply, replayed, ends it."""
    hub, _ = system
    instance_id = await start(hub, FROZEN_V3, [{"send": RESERVE}, {"send": RELEASE}, {"done": "Cancelled"}])
    await ignore_one_reply(hub, instance_id)
    await hub.client.raise_event(instance_id, CANCEL_EVENT, {"orderId": instance_id.rsplit(":", 1)[0]})
    events = await until(hub, instance_id, "the cancel", lambda e: count(e, H.EVENT_RAISED, CANCEL_EVENT) == 1)
    assert scheduled_by_the_episode_of(events, H.EVENT_RAISED, CANCEL_EVENT) == [fn.ADVANCE_ORDER]


# ---- case (b): a cancel during the second step --------------------------------------------------------------------


@pytest.mark.parametrize("version", [FROZEN_V3, WORKFLOW_VERSION])
async def test_a_cancel_during_the_second_step_reaches_the_next_decision_at_once(
    system: tuple[Hub, ManualClock], version: str
) -> None:
    hub, _ = system
    answers = [{"send": RESERVE}, {"send": CHARGE}, {"send": RELEASE}, {"done": "Cancelled"}]
    instance_id = await start(hub, version, answers)
    await hub.client.raise_event(instance_id, reply_event_name(RESERVE), reply(instance_id, RESERVE))
    await until(hub, instance_id, "the second race", lambda e: count(e, H.TIMER_CREATED) == 2)
    await hub.client.raise_event(instance_id, CANCEL_EVENT, {"orderId": instance_id.rsplit(":", 1)[0]})
    events = await until(hub, instance_id, "the cancel", lambda e: count(e, H.EVENT_RAISED, CANCEL_EVENT) == 1)
    # The second race's WhenAny holds the reply wait and the timer, not the cancel; the cancelled timer ends it.
    assert scheduled_by_the_episode_of(events, H.EVENT_RAISED, CANCEL_EVENT) == [fn.ADVANCE_ORDER]
    await until(hub, instance_id, "the compensation's race", lambda e: count(e, H.TASK_COMPLETED) == 3)
    assert CALLS[instance_id][2]["cancel"] is True
    await hub.client.raise_event(instance_id, reply_event_name(RELEASE), reply(instance_id, RELEASE))
    status = await hub.engine.wait_for_status(instance_id, ("Completed", "Failed"), WAIT)
    assert status["output"] == {"outcome": "cancelled"}, status
