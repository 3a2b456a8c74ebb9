"""The Scheduler's reply wait against events buffered before it waits: no spin, no lost reply (issue 7, item 4).

azure-functions-durable-python #507 (open): "When an event notification is raised for an orchestrator that is not yet
waiting, then using `wait_for_external_event` multiple times will always yield that same specific initial event."
In the SDK (1.7.0, models/TaskOrchestrationExecutor.py `set_task_value`), an EventRaised that finds no open task of
its name is kept in `context.deferred_tasks[name]` — one entry per name, so a later one replaces an earlier one — and
`DurableOrchestrationContext._add_to_open_tasks` completes every newly registered wait of that name from the entry,
which it never removes. The Scheduler's wait loop ignores a malformed or mismatched reply and waits again on the same
name (`AgentReply:<step>`), so one such buffered reply would be yielded again and again, synchronously, in one
episode (a RecursionError that fails the orchestration), and the valid reply would never be read.

These tests run the real `order_workflow` orchestrator on devhost's Durable engine, through the real SDK, and raise
every event through the real `DurableOrchestrationClient.raise_event`, as triggers/agent_replies.py does (so the
orchestrator receives each reply as a JSON `str`, SDK #295). The activities are stubs in this module: the point is
the orchestrator's event handling; the activities have their own tests. The step timeout is 10 minutes of real time,
so the durable timer never wins the race while a test runs.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import azure.durable_functions as df
import pytest
from azure.durable_functions import DurableOrchestrationClient
from azure.durable_functions.models.history.HistoryEventType import HistoryEventType as H

from devhost.durable import DurableEngine
from orchestrators import order_workflow
from orderflow import function_names as fn
from orderflow.messages import STEPS, AgentReply, reply_event_name
from tests.host.durable.harness import HubFactory

WAIT = 30.0  # bound for every condition wait; a passing test never gets near it
STEP_TIMEOUT_SECONDS = 600

# ---- stub activities (async: they run on the engine's loop, which is the test's loop) -------------------------
stubs = df.Blueprint()
RECORDED: dict[str, list[dict[str, Any]]] = {}  # instance id → record_step_result / finish_order inputs, in order
SEND_GATES: dict[str, asyncio.Event] = {}  # "<instanceId>:<step>" → released by the test
SENDING: dict[str, asyncio.Event] = {}  # "<instanceId>:<step>" → set when the stub is entered


@stubs.function_name(fn.LOAD_ORDER)
@stubs.activity_trigger(input_name="request")
async def load_order(request: dict) -> dict:
    return {"orderId": request["orderId"]}


@stubs.function_name(fn.SET_STEP_DEADLINE)
@stubs.activity_trigger(input_name="request")
async def set_step_deadline(request: dict) -> bool:
    return True


@stubs.function_name(fn.SEND_AGENT_REQUEST)
@stubs.activity_trigger(input_name="request")
async def send_agent_request(request: dict) -> str:
    key = f"{request['instanceId']}:{request['step']}"
    SENDING.setdefault(key, asyncio.Event()).set()
    gate = SEND_GATES.get(key)
    if gate is not None:
        await gate.wait()
    return key


@stubs.function_name(fn.RECORD_STEP_RESULT)
@stubs.activity_trigger(input_name="request")
async def record_step_result(request: dict) -> bool:
    RECORDED.setdefault(request["instanceId"], []).append({"activity": fn.RECORD_STEP_RESULT, **request})
    return True


@stubs.function_name(fn.FINISH_ORDER)
@stubs.activity_trigger(input_name="request")
async def finish_order(request: dict) -> bool:
    RECORDED.setdefault(request["instanceId"], []).append({"activity": fn.FINISH_ORDER, **request})
    return True


_app = df.DFApp()
_app.register_functions(order_workflow.bp)
_app.register_functions(stubs)
FUNCTIONS = _app.get_functions()


class Hub:
    """One devhost Durable engine serving the Scheduler, and the real SDK client bound to it."""

    def __init__(self, engine: DurableEngine, client: DurableOrchestrationClient) -> None:
        self.engine = engine
        self.client = client

    def history(self, instance_id: str) -> list[dict[str, Any]]:
        return self.engine.store.history(instance_id)

    async def until(self, instance_id: str, what: str, predicate: Any) -> list[dict[str, Any]]:
        """Wait (event-driven, bounded) for a history condition; stop early if the instance ended."""

        def done(events: list[dict[str, Any]]) -> bool:
            return bool(predicate(events)) or any(
                e["EventType"] in (H.EXECUTION_COMPLETED, H.EXECUTION_FAILED) for e in events
            )

        try:
            events = await self.engine.wait_for_history(instance_id, done, WAIT)
        except TimeoutError:
            raise AssertionError(f"timed out after {WAIT}s waiting for {what}") from None
        if not predicate(events):
            status = await self.engine.get_status(instance_id) or {}
            raise AssertionError(f"{what}: the instance is {status.get('runtimeStatus')}: {status.get('output')}")
        return events


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    factory = HubFactory(tmp_path / "durable.db")
    try:
        started = await factory.start(functions=FUNCTIONS)
        yield Hub(started.engine, started.client)
    finally:
        await factory.close()  # closes the engine, the invoker and the SDK's global aiohttp session


def reply(instance_id: str, step: str, **overrides: Any) -> dict[str, Any]:
    """A reply as the Agent sends it and agent_replies raises it (`AgentReply.to_dict()`)."""
    order_id, attempt = instance_id.rsplit(":", 1)
    return {
        "schemaVersion": 1,
        "type": "AgentReply",
        "instanceId": instance_id,
        "orderId": order_id,
        "attempt": int(attempt),
        "step": step,
        "outcome": "succeeded",
        "permanent": False,
        "errorCode": None,
        "error": None,
        "result": {"ok": True},
        "completedAt": "2026-01-01T00:00:01Z",
        **overrides,
    }


def bad_replies(instance_id: str, step: str) -> dict[str, Any]:
    order_id = instance_id.rsplit(":", 1)[0]
    return {
        "malformed": {"schemaVersion": 1, "type": "AgentReply", "instanceId": instance_id, "step": step},
        "mismatched": reply(f"{order_id}:7", step),  # another attempt's reply (wrong instanceId)
        "wrong-step": reply(instance_id, STEPS[2].value),  # a reply naming another step, under this step's event
    }


def count(events: list[dict[str, Any]], kind: H, name: str | None = None) -> int:
    return sum(1 for e in events if e["EventType"] == kind and (name is None or e.get("Name") == name))


async def start(hub: Hub, gate_first_send: bool) -> str:
    instance_id = f"evt-{uuid.uuid4().hex[:8]}:1"
    if gate_first_send:
        SEND_GATES[f"{instance_id}:{STEPS[0].value}"] = asyncio.Event()
    SENDING[f"{instance_id}:{STEPS[0].value}"] = asyncio.Event()
    await hub.client.start_new(
        fn.ORDER_WORKFLOW,
        instance_id,
        {"orderId": instance_id.rsplit(":", 1)[0], "attempt": 1, "stepTimeoutSeconds": STEP_TIMEOUT_SECONDS},
    )
    return instance_id


async def finish_remaining_steps(hub: Hub, instance_id: str) -> dict[str, Any]:
    """Steps 2 and 3: a valid reply each, raised once the Scheduler waits for it (its timer is in the history)."""
    for index, step in enumerate(STEPS[1:], start=2):
        await hub.until(
            instance_id, f"the wait of step {step.value}", lambda events, n=index: count(events, H.TIMER_CREATED) >= n
        )
        await hub.client.raise_event(instance_id, reply_event_name(step.value), reply(instance_id, step.value))
    status = await hub.engine.wait_for_status(instance_id, ("Completed", "Failed", "Terminated"), WAIT)
    return status


def assert_completed_with_every_valid_reply(status: dict[str, Any], instance_id: str) -> None:
    assert status["runtimeStatus"] == "Completed", status
    assert status["output"] == {"outcome": "completed"}
    recorded = RECORDED[instance_id]
    assert [(r["activity"], r.get("step"), r.get("status")) for r in recorded] == [
        *((fn.RECORD_STEP_RESULT, s.value, "succeeded") for s in STEPS),
        (fn.FINISH_ORDER, None, None),
    ]


def replies_taken_in_a_full_replay(instance_id: str, events: list[dict[str, Any]]) -> list[object]:
    """Replay the final history through the real SDK once more, recording every reply the wait loop parses.

    In one replay the Scheduler's code runs once from the start to its end, so this is how many times it received a
    reply event over the whole orchestration (a spinning loop receives one again and again).
    """
    handle = next(f for f in FUNCTIONS if f.get_function_name() == fn.ORDER_WORKFLOW).get_user_function()
    taken: list[object] = []
    original = AgentReply.__dict__["from_event"]

    def recording(cls: type[AgentReply], value: object) -> AgentReply:
        taken.append(value)
        return original.__func__(cls, value)  # type: ignore[no-any-return]

    started = next(e for e in events if e["EventType"] == H.EXECUTION_STARTED)
    context = {
        "history": [{**e, "IsPlayed": True} for e in events],
        "input": started.get("Input"),
        "instanceId": instance_id,
        "isReplaying": True,
        "parentInstanceId": None,
        "upperSchemaVersion": 0,
    }
    AgentReply.from_event = classmethod(recording)  # type: ignore[method-assign, assignment]
    try:
        state = json.loads(handle(json.dumps(context)))
    finally:
        AgentReply.from_event = original  # type: ignore[method-assign]
    assert state["isDone"] and state["output"] == {"outcome": "completed"}, state
    return taken


def assert_bounded(instance_id: str, events: list[dict[str, Any]], ignorable: int) -> None:
    """No spin: each reply event recorded once, a bounded number of episodes, each reply received at most once."""
    first = reply_event_name(STEPS[0].value)
    assert count(events, H.EVENT_RAISED, first) == 1 + ignorable
    assert count(events, H.EVENT_RAISED) == len(STEPS) + ignorable
    # At most one episode per history message: the start, the load, 4 per step (deadline, send, reply, record), the
    # finish = 15, plus one per ignorable event raised; the engine may batch messages, which only lowers it.
    assert count(events, H.ORCHESTRATOR_STARTED) <= 15 + ignorable
    taken = replies_taken_in_a_full_replay(instance_id, events)
    # The SDK keeps one buffered event per name (the last one), so an earlier buffered one may never reach the
    # Scheduler; none may reach it twice. (That the valid reply of each step was taken: RECORDED, the output.)
    assert len(STEPS) <= len(taken) <= len(STEPS) + ignorable, taken
    # Every reply reached the orchestrator as the JSON string the Python client posts (SDK #295, devhost as Azure).
    assert all(isinstance(v, str) for v in taken)


@pytest.mark.parametrize("bad", [("malformed", "mismatched"), ("mismatched", "malformed"), ("wrong-step",)])
async def test_bad_replies_buffered_before_the_wait_neither_spin_nor_hide_the_valid_reply(
    hub: Hub, bad: tuple[str, ...]
) -> None:
    step = STEPS[0].value
    instance_id = await start(hub, gate_first_send=True)
    await asyncio.wait_for(SENDING[f"{instance_id}:{step}"].wait(), WAIT)  # the Scheduler is not waiting yet
    for kind in bad:
        await hub.client.raise_event(instance_id, reply_event_name(step), bad_replies(instance_id, step)[kind])
    before_wait = await hub.until(
        instance_id, "the bad replies in the history", lambda events: count(events, H.EVENT_RAISED) == len(bad)
    )
    assert count(before_wait, H.TIMER_CREATED) == 0  # buffered: raised before the Scheduler waits

    SEND_GATES[f"{instance_id}:{step}"].set()
    await hub.until(instance_id, "the wait of the first step", lambda events: count(events, H.TIMER_CREATED) == 1)
    assert RECORDED.get(instance_id) is None  # no bad reply was taken for a result
    await hub.client.raise_event(instance_id, reply_event_name(step), reply(instance_id, step))

    status = await finish_remaining_steps(hub, instance_id)
    assert_completed_with_every_valid_reply(status, instance_id)
    assert_bounded(instance_id, hub.history(instance_id), ignorable=len(bad))


async def test_bad_and_valid_replies_all_buffered_before_the_wait_complete_the_step(hub: Hub) -> None:
    step = STEPS[0].value
    instance_id = await start(hub, gate_first_send=True)
    await asyncio.wait_for(SENDING[f"{instance_id}:{step}"].wait(), WAIT)
    bad = bad_replies(instance_id, step)
    for body in (bad["malformed"], bad["mismatched"], reply(instance_id, step)):
        await hub.client.raise_event(instance_id, reply_event_name(step), body)
    before_wait = await hub.until(
        instance_id, "all three replies in the history", lambda events: count(events, H.EVENT_RAISED) == 3
    )
    assert count(before_wait, H.TIMER_CREATED) == 0

    SEND_GATES[f"{instance_id}:{step}"].set()
    status = await finish_remaining_steps(hub, instance_id)
    assert_completed_with_every_valid_reply(status, instance_id)
    assert_bounded(instance_id, hub.history(instance_id), ignorable=2)
