"""A superseded attempt is fenced out: its activities report False and its Scheduler stops quietly as superseded.

Seed 000/001, "Interactions" and the README's state machine: every state-store write from the Scheduler is fenced on
LockedBy == its instance id; "a fenced update from an instance that no longer holds LockedBy raises `Fenced`: the
activity returns false and the orchestration stops quietly". Here attempt 1 (`o-1:1`) runs the real `order_workflow`
orchestrator through the real SDK replay engine (tests/support/orchestration_driver.py), each of its activities
executed for real on the embedded store and broker, while the Supervisor and the Starter hand the order to attempt 2
(`o-1:2`) just before one of attempt 1's fenced activities runs. That activity must return False (not None, not
True); the orchestration must end superseded; attempt 2's record, the app's statuses and the operator's alerts must
be left exactly as they were.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from azure.durable_functions.models.actions.ActionType import ActionType
from support.integration_support import Pipeline, claim_orders
from support.orchestration_driver import Driver

from orderflow import function_names as fn
from orderflow.adapters import aio_bus_from_connection_string
from orderflow.messages import STEPS, OrderStatus, reply_event_name
from orderflow.starter import run_starter
from orderflow.supervisor import run_supervisor

ORDER = "o-1"
STEP_TIMEOUT_SECONDS = 10


@pytest.fixture(scope="module")
def functions() -> dict[str, Any]:
    """The Scheduler's functions as the worker calls them, from the blueprints (not `app.get_functions()`, which
    validates and may be called only once per app)."""
    import activities.frozen_versions
    import activities.state
    import orchestrators.order_workflow

    modules = (activities.state, activities.frozen_versions, orchestrators.order_workflow)
    builders = [getattr(module, name) for module in modules for name in dir(module)]
    found = {
        b._function.get_function_name(): b._function.get_user_function()
        for b in builders
        if hasattr(b, "_function") and hasattr(b._function, "get_user_function")
    }
    assert {
        fn.ORDER_WORKFLOW,
        fn.LOAD_ORDER,
        fn.SET_STEP_DEADLINE,
        fn.SEND_AGENT_REQUEST,
        fn.RECORD_STEP_RESULT,
        fn.FINISH_ORDER,
    } <= found.keys(), found.keys()
    return found


def reply(instance: str, step: str, *, permanent_failure: bool) -> dict[str, Any]:
    outcome = (
        {"outcome": "failed", "permanent": True, "errorCode": "Declined", "error": "card declined"}
        if (permanent_failure)
        else {"outcome": "succeeded", "permanent": False, "errorCode": None, "error": None}
    )
    return {
        "schemaVersion": 1,
        "type": "AgentReply",
        "instanceId": instance,
        "orderId": ORDER,
        "attempt": 1,
        "step": step,
        "result": {},
        "completedAt": "2024-01-01T00:00:01Z",
        **outcome,
    }


async def hand_over_to_attempt_2(p: Pipeline) -> None:
    """The Supervisor recovers attempt 1 (its CompleteBy expired) and the Starter claims attempt 2."""
    lease = max(p.services.tunables.claim_lease, timedelta(seconds=STEP_TIMEOUT_SECONDS))
    p.clock.advance(lease + timedelta(seconds=1))  # past attempt 1's CompleteBy
    assert (await run_supervisor(p.services)).recovered == [ORDER]
    p.clock.advance(timedelta(hours=1))  # past any retry backoff
    assert (await run_starter(p.services, _no_start)).claimed == [f"{ORDER}:2"]


async def _no_start(name: str, instance_id: str, inp: Any) -> str:
    return instance_id  # attempt 2's orchestration is not run here: only its claim on the record matters


async def agent_requests(p: Pipeline) -> list[dict[str, Any]]:
    async with aio_bus_from_connection_string(p.bus_connection) as bus:
        async with bus.get_queue_receiver(p.services.tunables.agent_requests_queue, session_id=ORDER) as receiver:
            msgs = await receiver.peek_messages(max_message_count=100)
    return [json.loads(b"".join(m.body)) for m in msgs]


async def run_attempt_1(
    p: Pipeline, functions: dict[str, Any], *, takeover_before: tuple[str, int], permanent_failure: bool
) -> tuple[Any, list[tuple[str, Any]], dict[str, Any]]:
    """Drive attempt 1 to its end; hand the order over just before the n-th call of the named activity.

    Returns the orchestration's output, every activity call with its result, and attempt 2's record as it was
    right after the hand-over (serialized, with its etag)."""
    instance = f"{ORDER}:1"
    driver = Driver(
        functions[fn.ORDER_WORKFLOW],
        instance,
        {"orderId": ORDER, "attempt": 1, "stepTimeoutSeconds": STEP_TIMEOUT_SECONDS},
    )
    driver.now = p.clock.now()  # the orchestration's clock is the deployment's (CompleteBy is compared with it)
    calls: list[tuple[str, Any]] = []
    after_takeover: dict[str, Any] = {}
    actions = driver.episode()
    while not driver.done:
        events = []
        for action in actions:
            if action["actionType"] == ActionType.WAIT_FOR_EXTERNAL_EVENT:
                step = action["externalEventName"].split(":", 1)[1]
                assert action["externalEventName"] == reply_event_name(step)
                events.append(
                    driver.event_raised(
                        action["externalEventName"], reply(instance, step, permanent_failure=permanent_failure)
                    )
                )
            elif action["actionType"] in (ActionType.CALL_ACTIVITY, ActionType.CALL_ACTIVITY_WITH_RETRY):
                name = action["functionName"]
                if (name, sum(1 for c in calls if c[0] == name) + 1) == takeover_before:
                    await hand_over_to_attempt_2(p)
                    after_takeover = await snapshot(p)
                result = await functions[name](json.loads(action["input"]))
                calls.append((name, result))
                events.append(driver.completed(action["taskId"], result))
        assert events, f"attempt 1 stalled on {actions}"
        actions = driver.episode(*events)
    assert after_takeover, f"{takeover_before} was never called: {calls}"
    return driver.output, calls, after_takeover


async def snapshot(p: Pipeline) -> dict[str, Any]:
    found = await p.services.state.get(ORDER)
    assert found is not None
    record, etag = found
    assert record.locked_by == f"{ORDER}:2"
    return {"record": record.model_dump(mode="json"), "etag": etag}


CASES = {
    # (the activity that finds the record taken over, its call number, the Agent's replies fail permanently)
    "step-deadline": ((fn.SET_STEP_DEADLINE, 2), False),  # step 2's deadline: after step 1 was recorded
    "record-step": ((fn.RECORD_STEP_RESULT, 1), False),
    "finish-completed": ((fn.FINISH_ORDER, 1), False),
    "finish-failed": ((fn.FINISH_ORDER, 1), True),  # would send `failed` and an OrderFailed alert
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_fenced_out_activity_reports_false_and_the_attempt_stops_quietly(
    p: Pipeline, functions: dict[str, Any], case: str
) -> None:
    takeover_before, permanent_failure = CASES[case]
    await claim_orders(p, ORDER)

    output, calls, after_takeover = await run_attempt_1(
        p, functions, takeover_before=takeover_before, permanent_failure=permanent_failure
    )

    name, number = takeover_before
    fenced = [result for n, result in calls if n == name][number - 1]
    assert fenced is False, calls  # refused, and reported as refused
    assert calls[-1] == (name, False)  # the attempt's last activity: nothing ran after it
    assert output["outcome"] == "superseded", output
    assert await snapshot(p) == after_takeover  # attempt 2's record untouched (same data, same etag)
    assert [s.state for s in await p.statuses(ORDER)] == [OrderStatus.RECEIVED]  # no completed / failed
    assert [a for a in await p.alerts() if a.order_id == ORDER] == []
    requests = [(r["instanceId"], r["step"]) for r in await agent_requests(p)]
    sent_before = sum(1 for n, _ in calls if n == fn.SEND_AGENT_REQUEST)
    assert len(requests) == sent_before and all(i == f"{ORDER}:1" for i, _ in requests)
    if name == fn.SET_STEP_DEADLINE:  # no Agent request for a step whose deadline was refused
        assert STEPS[1].value not in [s for _, s in requests]
