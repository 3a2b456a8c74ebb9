"""The Scheduler driven step by step through the real replay engine (tests/unit/orchestration_driver.py)."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import pytest
from azure.durable_functions.models.actions.ActionType import ActionType
from support.orchestration_driver import Driver

from orderflow import function_names as fn
from orderflow.messages import STEPS, reply_event_name

ORDER = "o-1"
CALLS = (ActionType.CALL_ACTIVITY, ActionType.CALL_ACTIVITY_WITH_RETRY)
INSTANCE = f"{ORDER}:1"


@pytest.fixture(scope="module")
def handle() -> Any:
    import function_app

    return {f.get_function_name(): f for f in function_app.app.get_functions()}[fn.ORDER_WORKFLOW].get_user_function()


@pytest.fixture()
def driver(handle: Any) -> Driver:
    return Driver(handle, INSTANCE, {"orderId": ORDER, "attempt": 1, "stepTimeoutSeconds": 30})


def reply(step: str, outcome: str = "succeeded", *, instance: str = INSTANCE, permanent: bool = False,
          error: str | None = None) -> dict[str, Any]:
    return {"schemaVersion": 1, "type": "AgentReply", "instanceId": instance, "orderId": ORDER,
            "attempt": int(instance.rsplit(":", 1)[1]), "step": step, "outcome": outcome, "permanent": permanent,
            "errorCode": "Declined" if error else None, "error": error, "result": {},
            "completedAt": "2026-01-01T00:00:01Z"}


def activity(actions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    # Every Scheduler activity is called with retry options (orchestrators/order_workflow.py ACTIVITY_RETRY).
    found = [a for a in actions if a["actionType"] == ActionType.CALL_ACTIVITY_WITH_RETRY and a["functionName"] == name]
    assert all(a["retryOptions"]["maxNumberOfAttempts"] == 3 for a in found)
    assert found, f"expected a call of {name}, got {actions}"
    return found[0]


def start_step(d: Driver, actions: list[dict[str, Any]], step: str) -> dict[str, Any]:
    """From a set_step_deadline call to the race: returns the timer action."""
    deadline = activity(actions, fn.SET_STEP_DEADLINE)
    assert json.loads(deadline["input"])["step"] == step
    actions = d.episode(d.completed(deadline["taskId"], True))
    send = activity(actions, fn.SEND_AGENT_REQUEST)
    request = json.loads(send["input"])
    assert request["idempotencyKey"] == f"{ORDER}:{step}" and request["instanceId"] == INSTANCE
    assert request["maxRetries"] == 4  # the retry allowance travels with the request
    actions = d.episode(d.completed(send["taskId"], f"{INSTANCE}:{step}"))
    waits = [a for a in actions if a["actionType"] == ActionType.WAIT_FOR_EXTERNAL_EVENT]
    assert [w["externalEventName"] for w in waits] == [reply_event_name(step)]
    timer = next(a for a in actions if a["actionType"] == ActionType.CREATE_TIMER)
    assert datetime.fromisoformat(timer["fireAt"].replace("Z", "+00:00")) == datetime.fromisoformat(
        request["deadline"])
    return timer


def test_happy_path_runs_steps_in_order_and_cancels_each_timer(driver: Driver) -> None:
    actions = driver.episode()
    load = activity(actions, fn.LOAD_ORDER)
    actions = driver.episode(driver.completed(load["taskId"], {"orderId": ORDER}))
    for step in STEPS:
        driver.advance(1)  # distinct CompleteBy per step
        timer = start_step(driver, actions, step.value)
        actions = driver.episode(driver.event_raised(reply_event_name(step.value), reply(step.value)))
        timers = [a for group in driver.result["actions"] for a in group if a.get("fireAt") == timer["fireAt"]]
        assert [t["isCanceled"] for t in timers] == [True]
        record = activity(actions, fn.RECORD_STEP_RESULT)
        assert json.loads(record["input"])["status"] == "succeeded"
        actions = driver.episode(driver.completed(record["taskId"], True))
    finish = activity(actions, fn.FINISH_ORDER)
    assert json.loads(finish["input"])["outcome"] == "completed"
    driver.episode(driver.completed(finish["taskId"], True))
    assert driver.done and driver.output == {"outcome": "completed"}


def test_timer_first_ends_the_attempt_without_touching_the_record(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    timer = start_step(driver, actions, STEPS[0].value)
    driver.advance(30)
    actions = driver.episode(driver.timer_fired(timer["taskId"]))
    assert driver.done and driver.output == {"outcome": "timedOut", "step": STEPS[0].value}
    assert not [a for a in actions if a["actionType"] in CALLS]


def test_superseded_attempt_stops_quietly_at_the_fenced_deadline(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    actions = driver.episode(driver.completed(activity(actions, fn.SET_STEP_DEADLINE)["taskId"], False))
    assert driver.done and driver.output == {"outcome": "superseded", "step": STEPS[0].value}
    assert actions == []


def test_lost_lock_before_loading_stops_quietly(driver: Driver) -> None:
    actions = driver.episode()
    driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], None))
    assert driver.done and driver.output == {"outcome": "superseded"}


def test_permanent_failure_records_the_step_and_finishes_failed(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    step = STEPS[1].value
    actions = driver.episode(driver.completed(activity(actions, fn.SET_STEP_DEADLINE)["taskId"], True))
    actions = driver.episode(driver.completed(activity(actions, fn.SEND_AGENT_REQUEST)["taskId"], "id"))
    actions = driver.episode(driver.event_raised(reply_event_name(STEPS[0].value), reply(STEPS[0].value)))
    actions = driver.episode(driver.completed(activity(actions, fn.RECORD_STEP_RESULT)["taskId"], True))
    start_step(driver, actions, step)
    actions = driver.episode(driver.event_raised(reply_event_name(step), reply(
        step, "failed", permanent=True, error="card declined")))
    record = activity(actions, fn.RECORD_STEP_RESULT)
    assert json.loads(record["input"])["status"] == "failed"
    actions = driver.episode(driver.completed(record["taskId"], True))
    finish = json.loads(activity(actions, fn.FINISH_ORDER)["input"])
    assert finish["outcome"] == "failed" and "card declined" in finish["reason"] and step in finish["reason"]


def test_transient_failure_reply_leaves_recovery_to_the_supervisor(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    start_step(driver, actions, STEPS[0].value)
    actions = driver.episode(driver.event_raised(reply_event_name(STEPS[0].value), reply(
        STEPS[0].value, "failed", error="retries exhausted")))
    assert driver.done and driver.output["outcome"] == "timedOut"
    assert not [a for a in actions if a["actionType"] in CALLS]


def test_reply_for_another_attempt_is_ignored_and_the_race_goes_on(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    step = STEPS[0].value
    timer = start_step(driver, actions, step)
    actions = driver.episode(driver.event_raised(reply_event_name(step), reply(step, instance=f"{ORDER}:7")))
    assert not driver.done
    assert not [a for a in actions if a["actionType"] in CALLS]
    driver.advance(30)
    driver.episode(driver.timer_fired(timer["taskId"]))
    assert driver.done and driver.output["outcome"] == "timedOut"


def test_logs_only_when_not_replaying(driver: Driver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="orderflow.scheduler")
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    step = STEPS[0].value
    timer = start_step(driver, actions, step)
    driver.episode(driver.event_raised(reply_event_name(step), reply(step, instance=f"{ORDER}:7")))
    driver.advance(30)
    driver.episode(driver.timer_fired(timer["taskId"]))
    messages = [r.getMessage() for r in caplog.records]
    assert sum("ignoring a reply" in m for m in messages) == 1  # logged in its episode, not again on replay
    assert sum("timed out" in m for m in messages) == 1


def test_a_fenced_finish_reports_superseded_not_completed(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    for step in STEPS:
        start_step(driver, actions, step.value)
        actions = driver.episode(driver.event_raised(reply_event_name(step.value), reply(step.value)))
        actions = driver.episode(driver.completed(activity(actions, fn.RECORD_STEP_RESULT)["taskId"], True))
    finish = activity(actions, fn.FINISH_ORDER)
    driver.episode(driver.completed(finish["taskId"], False))  # the Supervisor recovered the record meanwhile
    assert driver.done and driver.output == {"outcome": "superseded"}


@pytest.mark.parametrize("as_str", [True, False], ids=["str (SDK #295)", "dict"])
def test_bad_replies_buffered_before_the_wait_are_taken_once_and_the_valid_one_after_them(
        driver: Driver, as_str: bool) -> None:
    # azure-functions-durable-python #507: an event raised before its wait is buffered in `deferred_tasks` and, in
    # SDK 1.7.0, handed again to every later wait of its name; the wait loop must not spin on it (a RecursionError
    # in one episode) and must still take the valid reply raised after it. On devhost: tests/devhost_durable/
    # test_scheduler_events.py.
    def encoded(body: dict[str, Any]) -> Any:
        return json.dumps(body) if as_str else body

    step = STEPS[0].value
    name = reply_event_name(step)
    actions = driver.episode()
    load = activity(actions, fn.LOAD_ORDER)
    actions = driver.episode(driver.completed(load["taskId"], {"orderId": ORDER}),
                             driver.event_raised(name, encoded({"instanceId": INSTANCE, "step": step})),
                             driver.event_raised(name, encoded(reply(step, instance=f"{ORDER}:7"))))
    actions = driver.episode(driver.completed(activity(actions, fn.SET_STEP_DEADLINE)["taskId"], True))
    actions = driver.episode(driver.completed(activity(actions, fn.SEND_AGENT_REQUEST)["taskId"], "id"))
    assert not driver.done and "error" not in driver.result
    # One wait per buffered reply taken (the SDK keeps only the last one buffered per name) and one left open: each
    # bad reply is taken at most once, where a spin would take one again and again.
    waits = [a for a in actions if a["actionType"] == ActionType.WAIT_FOR_EXTERNAL_EVENT]
    assert 2 <= len(waits) <= 3 and {w["externalEventName"] for w in waits} == {name}, waits
    timer = next(a for a in actions if a["actionType"] == ActionType.CREATE_TIMER)
    actions = driver.episode(driver.event_raised(name, encoded(reply(step))))
    timers = [a for group in driver.result["actions"] for a in group if a.get("fireAt") == timer["fireAt"]]
    assert timers and all(t["isCanceled"] for t in timers)  # one timer, listed with each task_any of the loop
    record = activity(actions, fn.RECORD_STEP_RESULT)
    assert json.loads(record["input"])["step"] == step and json.loads(record["input"])["status"] == "succeeded"
