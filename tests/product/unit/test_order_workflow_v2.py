"""The version-2 Scheduler (compensation and cancel) driven step by step through the real replay engine
(tests/support/orchestration_driver.py), as tests/product/unit/test_order_workflow.py does for version 1.

Version 2 races a `CancelOrder` external event with each forward step, asks SET_STEP_DEADLINE whether the record says
the client cancelled, and on a permanent failure or a cancel calls BEGIN_COMPENSATION and runs each compensation it
answers through the same deadline / Agent request / race / record path, then FINISH_ORDER. The version comes from
ExecutionStarted.Version when the history has one, else from the input's `workflowVersion`.
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
from support.workflow_actions import CALLS, INSTANCE, ORDER, activity, calls, reply, timer_cancelled

from orderflow import function_names as fn
from orderflow.messages import STEPS, reply_event_name
from orderflow.workflow import CANCEL_EVENT, WORKFLOW_V1, WORKFLOW_V2

V2 = WORKFLOW_V2  # what the Starter put in the input (and host.json defaultVersion) before version 3
V2_INPUT = {"orderId": ORDER, "attempt": 1, "stepTimeoutSeconds": 30, "workflowVersion": V2}
RESERVE, CHARGE, SHIP = (s.value for s in STEPS)
REFUND, RELEASE = "refund-payment", "release-inventory"


@pytest.fixture(scope="module")
def handle() -> Any:
    return user_function(fn.ORDER_WORKFLOW)


class VersionedDriver(Driver):
    """The driver with ExecutionStarted.Version set (the shared driver writes Version "")."""

    def __init__(self, handle: Any, instance_id: str, input_: Any, version: str) -> None:
        super().__init__(handle, instance_id, input_)
        self.version = version

    def _event(self, kind: H, **fields: Any) -> dict[str, Any]:
        if kind == H.EXECUTION_STARTED:
            fields["Version"] = self.version
        return super()._event(kind, **fields)


@pytest.fixture()
def driver(handle: Any) -> Driver:
    return Driver(handle, INSTANCE, V2_INPUT)


def scheduled(d: Driver, name: str) -> list[dict[str, Any]]:
    """The inputs of every call of activity `name` over the whole run."""
    return [json.loads(a["input"]) for a in d.scheduled if a["actionType"] in CALLS and a["functionName"] == name]


def load(d: Driver, loaded: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    actions = d.episode()
    request = json.loads(activity(actions, fn.LOAD_ORDER)["input"])
    assert request == {"orderId": ORDER, "instanceId": INSTANCE}
    return d.episode(
        d.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER} if loaded is None else loaded)
    )


def start_action(d: Driver, actions: list[dict[str, Any]], action: str, *, forward: bool = True) -> dict[str, Any]:
    """From the SET_STEP_DEADLINE call of a step (or compensation) to its race: returns the timer action.

    A forward step honours the cancel (honoursCancel true, `CancelOrder` in the race); a compensation does not."""
    deadline = activity(actions, fn.SET_STEP_DEADLINE)
    fenced = json.loads(deadline["input"])
    assert (fenced["orderId"], fenced["instanceId"], fenced["step"]) == (ORDER, INSTANCE, action)
    assert fenced["workflowVersion"] == V2 and fenced["honoursCancel"] is forward
    assert datetime.fromisoformat(fenced["completeBy"]) == d.now + timedelta(seconds=30)
    actions = d.episode(d.completed(deadline["taskId"], True))
    send = activity(actions, fn.SEND_AGENT_REQUEST)
    request = json.loads(send["input"])
    assert (request["step"], request["idempotencyKey"], request["instanceId"]) == (
        action,
        f"{ORDER}:{action}",
        INSTANCE,
    )
    assert request["deadline"] == fenced["completeBy"] and request["maxRetries"] == 4
    actions = d.episode(d.completed(send["taskId"], f"{INSTANCE}:{action}"))
    waits = [a["externalEventName"] for a in actions if a["actionType"] == ActionType.WAIT_FOR_EXTERNAL_EVENT]
    assert waits == ([reply_event_name(action), CANCEL_EVENT] if forward else [reply_event_name(action)]), waits
    timer = next(a for a in actions if a["actionType"] == ActionType.CREATE_TIMER)
    assert datetime.fromisoformat(timer["fireAt"].replace("Z", "+00:00")) == datetime.fromisoformat(request["deadline"])
    return timer


def succeed(d: Driver, actions: list[dict[str, Any]], step: str) -> list[dict[str, Any]]:
    """One forward step that succeeds: deadline, request, reply, record. Returns the actions after the record."""
    timer = start_action(d, actions, step)
    actions = d.episode(d.event_raised(reply_event_name(step), reply(step)))
    assert timer_cancelled(d, timer)
    record = activity(actions, fn.RECORD_STEP_RESULT)
    assert json.loads(record["input"]) == {
        "orderId": ORDER,
        "instanceId": INSTANCE,
        "step": step,
        "status": "succeeded",
        "error": None,
    }
    return d.episode(d.completed(record["taskId"], True))


def fail_shipping_after_two_successes(d: Driver) -> list[dict[str, Any]]:
    """reserve-inventory and charge-payment succeed, arrange-shipping fails permanently; returns the actions after
    RECORD_STEP_RESULT of the failure (BEGIN_COMPENSATION is among them)."""
    actions = load(d)
    actions = succeed(d, actions, RESERVE)
    actions = succeed(d, actions, CHARGE)
    start_action(d, actions, SHIP)
    actions = d.episode(
        d.event_raised(
            reply_event_name(SHIP), reply(SHIP, "failed", permanent=True, error="no carrier for the address")
        )
    )
    record = activity(actions, fn.RECORD_STEP_RESULT)
    assert json.loads(record["input"])["status"] == "failed" and json.loads(record["input"])["step"] == SHIP
    return d.episode(d.completed(record["taskId"], True))


def begin(d: Driver, actions: list[dict[str, Any]], cause: str, answer: list[str] | None) -> list[dict[str, Any]]:
    call = activity(actions, fn.BEGIN_COMPENSATION)
    request = json.loads(call["input"])
    assert (request["orderId"], request["instanceId"], request["cause"]) == (ORDER, INSTANCE, cause)
    assert datetime.fromisoformat(request["completeBy"]) == d.now + timedelta(seconds=30)
    return d.episode(d.completed(call["taskId"], answer))


def compensate(d: Driver, actions: list[dict[str, Any]], name: str, *, undone: bool) -> list[dict[str, Any]]:
    """One compensation that succeeds; returns the actions after its RECORD_STEP_RESULT."""
    timer = start_action(d, actions, name, forward=False)
    actions = d.episode(d.event_raised(reply_event_name(name), reply(name, result={"undone": undone})))
    assert timer_cancelled(d, timer)
    record = activity(actions, fn.RECORD_STEP_RESULT)
    assert json.loads(record["input"]) == {
        "orderId": ORDER,
        "instanceId": INSTANCE,
        "step": name,
        "status": "succeeded",
        "error": None,
        "undone": undone,
    }
    return d.episode(d.completed(record["taskId"], True))


# --- forward path -------------------------------------------------------------------------------------------------


def test_happy_path_carries_the_version_and_races_every_step_with_the_cancel(driver: Driver) -> None:
    actions = load(driver)
    for step in STEPS:
        actions = succeed(driver, actions, step.value)
    finish = activity(actions, fn.FINISH_ORDER)
    assert json.loads(finish["input"]) == {
        "orderId": ORDER,
        "instanceId": INSTANCE,
        "attempt": 1,
        "outcome": "completed",
        "reason": "all steps succeeded",
        "honoursCancel": True,
    }
    driver.episode(driver.completed(finish["taskId"], True))
    assert driver.done and driver.output == {"outcome": "completed"}
    assert [d["workflowVersion"] for d in scheduled(driver, fn.SET_STEP_DEADLINE)] == [V2, V2, V2]
    assert all(d["honoursCancel"] is True for d in scheduled(driver, fn.SET_STEP_DEADLINE))
    assert scheduled(driver, fn.BEGIN_COMPENSATION) == []


def test_version_1_input_runs_the_version_1_path(handle: Any) -> None:
    """No workflowVersion and ExecutionStarted.Version "": version 1, no cancel race, no compensation."""
    d = Driver(handle, INSTANCE, {"orderId": ORDER, "attempt": 1, "stepTimeoutSeconds": 30})
    assert_version_1(d)


def test_the_version_in_the_history_wins_over_the_input(handle: Any) -> None:
    """ExecutionStarted.Version 1 with an input saying 2: the instance started under version 1 stays there."""
    assert_version_1(VersionedDriver(handle, INSTANCE, V2_INPUT, WORKFLOW_V1))


def test_version_2_from_the_history_without_one_in_the_input(handle: Any) -> None:
    d = VersionedDriver(handle, INSTANCE, {"orderId": ORDER, "attempt": 1, "stepTimeoutSeconds": 30}, V2)
    actions = load(d)
    start_action(d, actions, RESERVE)  # asserts workflowVersion 2 (from the history), honoursCancel, the cancel race


def assert_version_1(d: Driver) -> None:
    actions = load(d)
    deadline = activity(actions, fn.SET_STEP_DEADLINE)
    assert set(json.loads(deadline["input"])) == {"orderId", "instanceId", "step", "completeBy"}
    actions = d.episode(d.completed(deadline["taskId"], True))
    actions = d.episode(d.completed(activity(actions, fn.SEND_AGENT_REQUEST)["taskId"], "id"))
    waits = [a["externalEventName"] for a in actions if a["actionType"] == ActionType.WAIT_FOR_EXTERNAL_EVENT]
    assert waits == [reply_event_name(RESERVE)]
    actions = d.episode(
        d.event_raised(reply_event_name(RESERVE), reply(RESERVE, "failed", permanent=True, error="out of stock"))
    )
    actions = d.episode(d.completed(activity(actions, fn.RECORD_STEP_RESULT)["taskId"], True))
    assert calls(actions) == [fn.FINISH_ORDER]  # version 1 ends in failed, no BEGIN_COMPENSATION
    finish = json.loads(activity(actions, fn.FINISH_ORDER)["input"])
    assert finish["outcome"] == "failed" and "out of stock" in finish["reason"]
    d.episode(d.completed(activity(actions, fn.FINISH_ORDER)["taskId"], True))
    assert d.done and d.output == {"outcome": "failed", "step": RESERVE}
    assert scheduled(d, fn.BEGIN_COMPENSATION) == []


# --- compensation after a permanent failure ---------------------------------------------------------------------


def test_a_permanent_failure_compensates_the_sent_steps_newest_first(driver: Driver) -> None:
    actions = fail_shipping_after_two_successes(driver)
    assert calls(actions) == [fn.BEGIN_COMPENSATION]
    assert scheduled(driver, fn.FINISH_ORDER) == []  # not finished failed: the sent steps are undone first
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", [REFUND, RELEASE])

    actions = compensate(driver, actions, REFUND, undone=True)
    actions = compensate(driver, actions, RELEASE, undone=False)

    finish = activity(actions, fn.FINISH_ORDER)
    assert json.loads(finish["input"]) == {
        "orderId": ORDER,
        "instanceId": INSTANCE,
        "attempt": 1,
        "outcome": "completed",
        "reason": "compensated",
    }
    driver.episode(driver.completed(finish["taskId"], True))
    assert driver.done and driver.output == {"outcome": "compensated"}
    sent = scheduled(driver, fn.SEND_AGENT_REQUEST)
    assert [s["step"] for s in sent] == [RESERVE, CHARGE, SHIP, REFUND, RELEASE]
    assert [s["idempotencyKey"] for s in sent[3:]] == [f"{ORDER}:{REFUND}", f"{ORDER}:{RELEASE}"]
    assert all(s["payload"] == {"orderId": ORDER} for s in sent)


def test_a_compensation_that_fails_permanently_finishes_compensation_failed(driver: Driver) -> None:
    actions = fail_shipping_after_two_successes(driver)
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", [REFUND, RELEASE])
    start_action(driver, actions, REFUND, forward=False)
    actions = driver.episode(
        driver.event_raised(
            reply_event_name(REFUND),
            reply(REFUND, "failed", permanent=True, error="refund window closed", error_code="RefundRefused"),
        )
    )
    record = activity(actions, fn.RECORD_STEP_RESULT)
    assert json.loads(record["input"]) == {
        "orderId": ORDER,
        "instanceId": INSTANCE,
        "step": REFUND,
        "status": "failed",
        "error": "refund window closed",
        "undone": None,
    }
    actions = driver.episode(driver.completed(record["taskId"], True))
    finish = json.loads(activity(actions, fn.FINISH_ORDER)["input"])
    assert finish["outcome"] == "failed"
    assert finish["reason"] == f"{REFUND}: RefundRefused: refund window closed"
    driver.episode(driver.completed(activity(actions, fn.FINISH_ORDER)["taskId"], True))
    assert driver.done and driver.output == {"outcome": "compensationFailed"}
    assert RELEASE not in [s["step"] for s in scheduled(driver, fn.SEND_AGENT_REQUEST)]  # stops at the failure


def test_a_circuit_open_reply_during_a_compensation_defers_it(driver: Driver) -> None:
    actions = fail_shipping_after_two_successes(driver)
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", [REFUND, RELEASE])
    timer = start_action(driver, actions, REFUND, forward=False)
    actions = driver.episode(
        driver.event_raised(
            reply_event_name(REFUND),
            reply(
                REFUND,
                "failed",
                error="circuit breaker open",
                error_code="CircuitOpen",
                result={"retryAfterSeconds": 7},
            ),
        )
    )
    assert timer_cancelled(driver, timer)
    assert calls(actions) == [fn.DEFER_ORDER]
    request = json.loads(activity(actions, fn.DEFER_ORDER)["input"])
    assert (request["orderId"], request["instanceId"], request["step"], request["retryAfterSeconds"]) == (
        ORDER,
        INSTANCE,
        REFUND,
        7,
    )
    assert request["reason"].startswith(f"{REFUND}: CircuitOpen")
    assert datetime.fromisoformat(request["retryAt"]) == driver.now + timedelta(seconds=7)
    driver.episode(driver.completed(activity(actions, fn.DEFER_ORDER)["taskId"], True))
    assert driver.done and driver.output == {"outcome": "deferred", "step": REFUND}
    assert [r["step"] for r in scheduled(driver, fn.RECORD_STEP_RESULT)] == [RESERVE, CHARGE, SHIP]
    assert scheduled(driver, fn.FINISH_ORDER) == []


def test_a_compensation_that_times_out_is_left_to_the_supervisor(driver: Driver) -> None:
    actions = fail_shipping_after_two_successes(driver)
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", [REFUND, RELEASE])
    timer = start_action(driver, actions, REFUND, forward=False)
    driver.advance(30)
    actions = driver.episode(driver.timer_fired(timer["taskId"]))
    assert driver.done and driver.output == {"outcome": "timedOut", "step": REFUND}
    assert calls(actions) == []
    assert scheduled(driver, fn.FINISH_ORDER) == [] and scheduled(driver, fn.DEFER_ORDER) == []


def test_a_transient_compensation_failure_is_left_to_the_supervisor(driver: Driver) -> None:
    actions = fail_shipping_after_two_successes(driver)
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", [REFUND])
    start_action(driver, actions, REFUND, forward=False)
    actions = driver.episode(driver.event_raised(reply_event_name(REFUND), reply(REFUND, "failed", error="503")))
    assert driver.done and driver.output == {"outcome": "timedOut", "step": REFUND, "error": "503"}
    assert calls(actions) == [] and scheduled(driver, fn.FINISH_ORDER) == []


def test_a_reply_for_another_compensation_or_attempt_is_ignored(driver: Driver) -> None:
    actions = fail_shipping_after_two_successes(driver)
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", [REFUND])
    timer = start_action(driver, actions, REFUND, forward=False)
    actions = driver.episode(driver.event_raised(reply_event_name(REFUND), reply(REFUND, instance=f"{ORDER}:7")))
    assert not driver.done and calls(actions) == []
    actions = driver.episode(driver.event_raised(reply_event_name(REFUND), reply(REFUND, result={"undone": True})))
    assert timer_cancelled(driver, timer)
    assert json.loads(activity(actions, fn.RECORD_STEP_RESULT)["input"])["undone"] is True


def test_a_cancel_event_during_a_compensation_changes_nothing(driver: Driver) -> None:
    actions = fail_shipping_after_two_successes(driver)
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", [REFUND])
    start_action(driver, actions, REFUND, forward=False)
    actions = driver.episode(driver.event_raised(CANCEL_EVENT, {"orderId": ORDER}))
    assert not driver.done and calls(actions) == []
    actions = driver.episode(driver.event_raised(reply_event_name(REFUND), reply(REFUND, result={"undone": True})))
    actions = driver.episode(driver.completed(activity(actions, fn.RECORD_STEP_RESULT)["taskId"], True))
    assert json.loads(activity(actions, fn.FINISH_ORDER)["input"])["reason"] == "compensated"


@pytest.mark.parametrize("fenced_at", [fn.RECORD_STEP_RESULT, fn.FINISH_ORDER, fn.SET_STEP_DEADLINE])
def test_a_fenced_compensation_stops_quietly(driver: Driver, fenced_at: str) -> None:
    actions = fail_shipping_after_two_successes(driver)
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", [REFUND])
    if fenced_at == fn.SET_STEP_DEADLINE:
        driver.episode(driver.completed(activity(actions, fn.SET_STEP_DEADLINE)["taskId"], False))
        assert driver.done and driver.output == {"outcome": "superseded", "step": REFUND}
        assert scheduled(driver, fn.SEND_AGENT_REQUEST)[-1]["step"] == SHIP  # the compensation was never sent
        return
    start_action(driver, actions, REFUND, forward=False)
    actions = driver.episode(driver.event_raised(reply_event_name(REFUND), reply(REFUND, result={"undone": True})))
    record = activity(actions, fn.RECORD_STEP_RESULT)
    if fenced_at == fn.RECORD_STEP_RESULT:
        driver.episode(driver.completed(record["taskId"], False))
        assert driver.done and driver.output == {"outcome": "superseded", "step": REFUND}
        assert scheduled(driver, fn.FINISH_ORDER) == []
        return
    actions = driver.episode(driver.completed(record["taskId"], True))
    driver.episode(driver.completed(activity(actions, fn.FINISH_ORDER)["taskId"], False))
    assert driver.done and driver.output == {"outcome": "superseded"}


# --- BEGIN_COMPENSATION's other answers ---------------------------------------------------------------------------


def test_nothing_sent_after_a_failure_ends_failed(driver: Driver) -> None:
    actions = load(driver)
    start_action(driver, actions, RESERVE)
    actions = driver.episode(
        driver.event_raised(reply_event_name(RESERVE), reply(RESERVE, "failed", permanent=True, error="out of stock"))
    )
    actions = driver.episode(driver.completed(activity(actions, fn.RECORD_STEP_RESULT)["taskId"], True))
    actions = begin(driver, actions, f"{RESERVE}: Declined: out of stock", [])
    assert driver.done and driver.output == {"outcome": "failed"}
    assert calls(actions) == [] and scheduled(driver, fn.FINISH_ORDER) == []  # the activity ended the order


def test_a_fenced_begin_compensation_is_superseded(driver: Driver) -> None:
    actions = fail_shipping_after_two_successes(driver)
    actions = begin(driver, actions, f"{SHIP}: Declined: no carrier for the address", None)
    assert driver.done and driver.output == {"outcome": "superseded"}
    assert calls(actions) == [] and scheduled(driver, fn.FINISH_ORDER) == []


# --- cancel -------------------------------------------------------------------------------------------------------


def test_the_cancel_event_wins_the_race_during_a_step(driver: Driver) -> None:
    actions = load(driver)
    actions = succeed(driver, actions, RESERVE)
    timer = start_action(driver, actions, CHARGE)
    actions = driver.episode(driver.event_raised(CANCEL_EVENT, {"orderId": ORDER}))
    assert timer_cancelled(driver, timer)
    assert calls(actions) == [fn.BEGIN_COMPENSATION]  # charge-payment's result is not recorded: no reply came
    actions = begin(driver, actions, "cancelled", [REFUND, RELEASE])
    actions = compensate(driver, actions, REFUND, undone=False)
    actions = compensate(driver, actions, RELEASE, undone=True)
    driver.episode(driver.completed(activity(actions, fn.FINISH_ORDER)["taskId"], True))
    assert driver.done and driver.output == {"outcome": "compensated"}
    assert [r["step"] for r in scheduled(driver, fn.RECORD_STEP_RESULT)] == [RESERVE, REFUND, RELEASE]


# The SDK buffers an event nothing waits for yet, with this warning, and hands it to the first wait of its name.
@pytest.mark.filterwarnings("ignore:Potential duplicate Task completion for TaskId. CancelOrder:UserWarning")
def test_a_cancel_raised_before_the_race_is_honoured_by_the_race(driver: Driver) -> None:
    """The event arrives with LOAD_ORDER's result (before anything waits for it): the first race still takes it."""
    actions = driver.episode()
    actions = driver.episode(
        driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}),
        driver.event_raised(CANCEL_EVENT, {"orderId": ORDER}),
    )
    timer = start_action(driver, actions, RESERVE)
    assert timer_cancelled(driver, timer)
    assert activity(driver.scheduled, fn.BEGIN_COMPENSATION)
    assert json.loads(activity(driver.scheduled, fn.BEGIN_COMPENSATION)["input"])["cause"] == "cancelled"


def test_a_recorded_cancel_stops_before_the_step_is_sent(driver: Driver) -> None:
    actions = load(driver)
    actions = succeed(driver, actions, RESERVE)
    deadline = activity(actions, fn.SET_STEP_DEADLINE)
    assert json.loads(deadline["input"])["step"] == CHARGE
    actions = driver.episode(driver.completed(deadline["taskId"], "cancel"))
    assert calls(actions) == [fn.BEGIN_COMPENSATION]
    actions = begin(driver, actions, "cancelled", [RELEASE])
    assert [s["step"] for s in scheduled(driver, fn.SEND_AGENT_REQUEST)] == [RESERVE]  # charge-payment never sent
    actions = compensate(driver, actions, RELEASE, undone=True)
    driver.episode(driver.completed(activity(actions, fn.FINISH_ORDER)["taskId"], True))
    assert driver.done and driver.output == {"outcome": "compensated"}


def test_a_cancel_recorded_during_the_last_step_is_honoured_at_the_finish(driver: Driver) -> None:
    """FINISH_ORDER answers "cancel" (the record says the client cancelled while the last step ran): the Scheduler
    compensates every step instead of finishing, so an accepted cancel is never dropped."""
    actions = load(driver)
    for step in STEPS:
        actions = succeed(driver, actions, step.value)
    actions = driver.episode(driver.completed(activity(actions, fn.FINISH_ORDER)["taskId"], "cancel"))
    assert calls(actions) == [fn.BEGIN_COMPENSATION]
    actions = begin(driver, actions, "cancelled", ["cancel-shipment", REFUND, RELEASE])
    for name in ("cancel-shipment", REFUND, RELEASE):
        actions = compensate(driver, actions, name, undone=True)
    finish = activity(actions, fn.FINISH_ORDER)
    assert "honoursCancel" not in json.loads(finish["input"])  # a compensation's end is not a decision point
    driver.episode(driver.completed(finish["taskId"], True))
    assert driver.done and driver.output == {"outcome": "compensated"}


@pytest.mark.parametrize("how", ["event", "record"])
def test_a_cancel_with_nothing_sent_ends_cancelled(driver: Driver, how: str) -> None:
    actions = load(driver)
    if how == "record":
        actions = driver.episode(driver.completed(activity(actions, fn.SET_STEP_DEADLINE)["taskId"], "cancel"))
    else:
        start_action(driver, actions, RESERVE)
        actions = driver.episode(driver.event_raised(CANCEL_EVENT, {"orderId": ORDER}))
    actions = begin(driver, actions, "cancelled", [])
    assert driver.done and driver.output == {"outcome": "cancelled"}
    assert calls(actions) == [] and scheduled(driver, fn.FINISH_ORDER) == []
    assert scheduled(driver, fn.RECORD_STEP_RESULT) == []
    assert len(scheduled(driver, fn.SEND_AGENT_REQUEST)) == (1 if how == "event" else 0)


def test_a_superseded_attempt_is_not_cancelled(driver: Driver) -> None:
    actions = load(driver)
    driver.episode(driver.completed(activity(actions, fn.SET_STEP_DEADLINE)["taskId"], False))
    assert driver.done and driver.output == {"outcome": "superseded", "step": RESERVE}
    assert scheduled(driver, fn.BEGIN_COMPENSATION) == []


# --- a compensation claimed by the Starter ------------------------------------------------------------------------


def test_a_plan_from_load_order_goes_straight_to_the_compensation(driver: Driver) -> None:
    actions = load(
        driver, {"orderId": ORDER, "currency": "EUR", "succeededSteps": [RESERVE], "plan": {"compensations": [RELEASE]}}
    )
    actions = compensate(driver, actions, RELEASE, undone=True)
    finish = activity(actions, fn.FINISH_ORDER)
    assert json.loads(finish["input"])["outcome"] == "completed"
    driver.episode(driver.completed(finish["taskId"], True))
    assert driver.done and driver.output == {"outcome": "compensated"}
    assert scheduled(driver, fn.BEGIN_COMPENSATION) == []
    [sent] = scheduled(driver, fn.SEND_AGENT_REQUEST)
    assert sent["step"] == RELEASE and sent["payload"] == {"orderId": ORDER, "currency": "EUR"}  # no bookkeeping


def test_a_plan_with_nothing_left_finishes_compensated(driver: Driver) -> None:
    actions = load(driver, {"orderId": ORDER, "succeededSteps": [], "plan": {"compensations": []}})
    finish = activity(actions, fn.FINISH_ORDER)
    assert json.loads(finish["input"])["outcome"] == "completed"
    assert scheduled(driver, fn.SEND_AGENT_REQUEST) == []


def test_an_empty_plan_runs_the_steps(driver: Driver) -> None:
    actions = load(driver, {"orderId": ORDER, "succeededSteps": [RESERVE], "plan": {}})
    start_action(driver, actions, CHARGE)


def test_a_cancel_raised_between_races_is_honoured_by_the_next_race(driver: Driver) -> None:
    """The event arrives while RECORD_STEP_RESULT runs (the cancel wait is open, no race is): were the record not to
    say so yet, the next step's race still takes it at once."""
    actions = load(driver)
    start_action(driver, actions, RESERVE)
    actions = driver.episode(driver.event_raised(reply_event_name(RESERVE), reply(RESERVE)))
    actions = driver.episode(
        driver.completed(activity(actions, fn.RECORD_STEP_RESULT)["taskId"], True),
        driver.event_raised(CANCEL_EVENT, {"orderId": ORDER}),
    )
    assert calls(actions) == [fn.SET_STEP_DEADLINE]
    timer = start_action(driver, actions, CHARGE)
    assert timer_cancelled(driver, timer)
    assert json.loads(activity(driver.scheduled, fn.BEGIN_COMPENSATION)["input"])["cause"] == "cancelled"
