"""The live Scheduler (version 4) driven episode by episode through the real replay engine (tests/support/
orchestration_driver.py, tests/support/workflow_actions.py), as test_order_workflow_v2.py does for version 2.

Version 3 introduced one ADVANCE_ORDER per decision point (orderflow/advance.py) and keeps version 2's race between
the timer at CompleteBy, the Agent's reply and, for a forward step, the client's `CancelOrder`; version 4 schedules the
same actions except after an ignored reply (the last tests). The happy path is 4 activities and 8 episodes (issue
13's targets: at most 5 and 8).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from azure.durable_functions.models.actions.ActionType import ActionType
from azure.durable_functions.models.history.HistoryEventType import HistoryEventType as H
from support.orchestration_driver import Driver
from support.product_app import user_function
from support.workflow_actions import activity, calls, reply, timer_cancelled

from orderflow import function_names as fn
from orderflow.messages import STEPS, reply_event_name
from orderflow.workflow import CANCEL_EVENT, WORKFLOW_V3, WORKFLOW_VERSION

ORDER = "o-1"
INSTANCE = f"{ORDER}:1"
INPUT = {"orderId": ORDER, "attempt": 1, "stepTimeoutSeconds": 30, "workflowVersion": WORKFLOW_VERSION}
RESERVE, CHARGE, SHIP = (s.value for s in STEPS)
RELEASE = "release-inventory"


@pytest.fixture(scope="module")
def handle() -> Any:
    return user_function(fn.ORDER_WORKFLOW)


@pytest.fixture()
def d(handle: Any) -> Driver:
    return Driver(handle, INSTANCE, INPUT)


def advance_call(
    d: Driver, actions: list[dict[str, Any]], result: dict[str, Any] | None = None, *, cancel: bool = False
) -> dict[str, Any]:
    """The ADVANCE_ORDER call among `actions`, checked: the result it carries, the cancel flag and a CompleteBy of
    the orchestration's now + the step timeout."""
    assert calls(actions) == [fn.ADVANCE_ORDER], actions
    call = activity(actions, fn.ADVANCE_ORDER)
    request = json.loads(call["input"])
    assert (request["orderId"], request["instanceId"], request["attempt"]) == (ORDER, INSTANCE, 1)
    assert request["workflowVersion"] == WORKFLOW_VERSION and request["agentRetries"] == 4
    assert datetime.fromisoformat(request["completeBy"]) == d.now + timedelta(seconds=30)
    assert request["result"] == result and request["cancel"] is cancel
    return call


def dispatched(d: Driver, call: dict[str, Any], action: str, *, forward: bool = True) -> dict[str, Any]:
    """ADVANCE_ORDER answers "send `action`": the race starts (reply wait, cancel wait for a forward step, the timer at
    the CompleteBy the Scheduler passed). Returns the timer action."""
    complete_by = json.loads(call["input"])["completeBy"]
    actions = d.episode(d.completed(call["taskId"], {"send": action}))
    waits = [a["externalEventName"] for a in actions if a["actionType"] == ActionType.WAIT_FOR_EXTERNAL_EVENT]
    assert waits == ([reply_event_name(action), CANCEL_EVENT] if forward else [reply_event_name(action)]), waits
    timer = next(a for a in actions if a["actionType"] == ActionType.CREATE_TIMER)
    assert datetime.fromisoformat(timer["fireAt"].replace("Z", "+00:00")) == datetime.fromisoformat(complete_by)
    assert calls(actions) == []
    return timer


def undo_reserve(d: Driver, call: dict[str, Any], end: str) -> None:
    """ADVANCE_ORDER `call` sends release-inventory: raced without the cancel, undone, handed to ADVANCE_ORDER, which
    answers that the order ended in `end`."""
    dispatched(d, call, RELEASE, forward=False)
    actions = d.episode(d.event_raised(reply_event_name(RELEASE), reply(RELEASE, result={"undone": True})))
    call = advance_call(d, actions, {"step": RELEASE, "status": "succeeded", "error": None, "undone": True})
    d.episode(d.completed(call["taskId"], {"done": end}))


def succeeded(step: str) -> dict[str, Any]:
    return {"step": step, "status": "succeeded", "error": None}


def test_happy_path_is_four_activities_and_eight_episodes(d: Driver) -> None:
    call = advance_call(d, d.episode())
    result = None
    for step in (RESERVE, CHARGE, SHIP):
        timer = dispatched(d, call, step)
        d.advance(1)
        actions = d.episode(d.event_raised(reply_event_name(step), reply(step)))
        assert timer_cancelled(d, timer)
        result = succeeded(step)
        call = advance_call(d, actions, result)
    d.episode(d.completed(call["taskId"], {"done": "Processed"}))
    assert d.done and d.output == {"outcome": "completed"}
    started = [e for e in d.history if e["EventType"] == int(H.ORCHESTRATOR_STARTED)]
    activities = [e for e in d.history if e["EventType"] == int(H.TASK_SCHEDULED)]
    assert (len(activities), len(started)) == (4, 8)


def test_a_permanent_failure_is_handed_to_advance_and_the_compensation_it_sends_is_raced_without_the_cancel(
    d: Driver,
) -> None:
    call = advance_call(d, d.episode())
    dispatched(d, call, RESERVE)
    actions = d.episode(d.event_raised(reply_event_name(RESERVE), reply(RESERVE)))
    call = advance_call(d, actions, succeeded(RESERVE))
    dispatched(d, call, CHARGE)
    actions = d.episode(
        d.event_raised(reply_event_name(CHARGE), reply(CHARGE, "failed", permanent=True, error="card declined"))
    )
    call = advance_call(
        d,
        actions,
        {
            "step": CHARGE,
            "status": "failed",
            "error": "card declined",
            "cause": "charge-payment: Declined: card declined",
        },
    )
    undo_reserve(d, call, "Compensated")
    assert d.output == {"outcome": "compensated"}


def test_a_cancel_that_wins_the_race_asks_advance_to_undo(d: Driver) -> None:
    call = advance_call(d, d.episode())
    timer = dispatched(d, call, RESERVE)
    actions = d.episode(d.event_raised(CANCEL_EVENT, {"orderId": ORDER}))
    assert timer_cancelled(d, timer)
    call = advance_call(d, actions, None, cancel=True)
    undo_reserve(d, call, "Cancelled")
    assert d.output == {"outcome": "cancelled"}


def test_the_timer_winning_ends_the_attempt_without_an_activity(d: Driver) -> None:
    call = advance_call(d, d.episode())
    timer = dispatched(d, call, RESERVE)
    d.advance(30)
    actions = d.episode(d.timer_fired(timer["taskId"]))
    assert calls(actions) == [] and d.done and d.output == {"outcome": "timedOut", "step": RESERVE}


def test_a_transient_failure_leaves_the_retry_to_the_supervisor(d: Driver) -> None:
    call = advance_call(d, d.episode())
    dispatched(d, call, RESERVE)
    actions = d.episode(d.event_raised(reply_event_name(RESERVE), reply(RESERVE, "failed", error="busy")))
    assert calls(actions) == [] and d.output == {"outcome": "timedOut", "step": RESERVE, "error": "busy"}


def test_an_open_breaker_defers_the_order(d: Driver) -> None:
    call = advance_call(d, d.episode())
    dispatched(d, call, RESERVE)
    actions = d.episode(
        d.event_raised(
            reply_event_name(RESERVE),
            reply(RESERVE, "failed", error="open", error_code="CircuitOpen", result={"retryAfterSeconds": 5}),
        )
    )
    defer = json.loads(activity(actions, fn.DEFER_ORDER)["input"])
    assert defer["retryAfterSeconds"] == 5 and defer["step"] == RESERVE
    d.episode(d.completed(activity(actions, fn.DEFER_ORDER)["taskId"], True))
    assert d.output == {"outcome": "deferred", "step": RESERVE}


def test_a_reply_for_another_attempt_is_ignored_and_the_wait_goes_on(d: Driver) -> None:
    call = advance_call(d, d.episode())
    dispatched(d, call, RESERVE)
    actions = d.episode(d.event_raised(reply_event_name(RESERVE), reply(RESERVE, instance=f"{ORDER}:2")))
    assert calls(actions) == [] and not d.done
    actions = d.episode(d.event_raised(reply_event_name(RESERVE), reply(RESERVE)))
    advance_call(d, actions, succeeded(RESERVE))


def test_a_fenced_out_advance_ends_the_attempt_quietly(d: Driver) -> None:
    call = advance_call(d, d.episode())
    d.episode(d.completed(call["taskId"], None))
    assert d.done and d.output == {"outcome": "superseded"}


def _atomic(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for action in actions:
        if action["actionType"] in (ActionType.WHEN_ANY, ActionType.WHEN_ALL):
            out.extend(_atomic(action["compoundActions"]))
        else:
            out.append(action)
    return out


@pytest.mark.parametrize(("version", "fresh_timer"), [(WORKFLOW_VERSION, True), (WORKFLOW_V3, False)])
def test_after_an_ignored_reply_the_next_wait_races_a_fresh_timer(handle: Any, version: str, fresh_timer: bool) -> None:
    """Under ReplaySchema V3, which the extension offers, a WhenAny's `compoundActions` hold only the children not
    scheduled before (azure/durable_functions/models/Task.py CompoundTask.__init__), and the extension's shim awaits
    exactly those (OutOfProcOrchestrationShim.InvokeAPIFromAction). Version 4 cancels the raced timer and races a new
    one at the same CompleteBy, so the second wait ends when the deadline passes; version 3 (frozen) waits on the
    reply alone (tests/host/durable/test_scheduler_replay.py shows the instance stay Running)."""
    d = Driver(handle, INSTANCE, {**INPUT, "workflowVersion": version}, upper_schema_version=2)
    call = activity(d.episode(), fn.ADVANCE_ORDER)
    race = d.episode(d.completed(call["taskId"], {"send": RESERVE}))
    first = next(a for a in race if a["actionType"] == ActionType.CREATE_TIMER)
    again = d.episode(d.event_raised(reply_event_name(RESERVE), reply(RESERVE, instance=f"{ORDER}:2")))
    kinds = [a["actionType"] for a in again]
    assert kinds == (
        [ActionType.WAIT_FOR_EXTERNAL_EVENT, ActionType.CREATE_TIMER]
        if fresh_timer
        else [ActionType.WAIT_FOR_EXTERNAL_EVENT]
    )
    timers = [a for a in _atomic(d.result["actions"][0]) if a["actionType"] == ActionType.CREATE_TIMER]
    assert [t["isCanceled"] for t in timers] == ([True, False] if fresh_timer else [False])
    assert all(t["fireAt"] == first["fireAt"] for t in timers)
    d.advance(30)
    d.episode(d.timer_fired(again[-1]["taskId"] if fresh_timer else first["taskId"]))
    assert d.done and d.output == {"outcome": "timedOut", "step": RESERVE}
