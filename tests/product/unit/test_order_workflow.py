"""The Scheduler driven step by step through the real replay engine (tests/product/unit/orchestration_driver.py)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
from azure.durable_functions.models.actions.ActionType import ActionType
from support.orchestration_driver import Driver
from support.product_app import user_function

from orderflow import function_names as fn
from orderflow.messages import STEPS, reply_event_name

ORDER = "o-1"
CALLS = (ActionType.CALL_ACTIVITY, ActionType.CALL_ACTIVITY_WITH_RETRY)
INSTANCE = f"{ORDER}:1"


@pytest.fixture(scope="module")
def handle() -> Any:
    return user_function(fn.ORDER_WORKFLOW)


@pytest.fixture()
def driver(handle: Any) -> Driver:
    return Driver(handle, INSTANCE, {"orderId": ORDER, "attempt": 1, "stepTimeoutSeconds": 30})


def reply(
    step: str,
    outcome: str = "succeeded",
    *,
    instance: str = INSTANCE,
    permanent: bool = False,
    error: str | None = None,
) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "type": "AgentReply",
        "instanceId": instance,
        "orderId": ORDER,
        "attempt": int(instance.rsplit(":", 1)[1]),
        "step": step,
        "outcome": outcome,
        "permanent": permanent,
        "errorCode": "Declined" if error else None,
        "error": error,
        "result": {},
        "completedAt": "2026-01-01T00:00:01Z",
    }


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
    assert datetime.fromisoformat(timer["fireAt"].replace("Z", "+00:00")) == datetime.fromisoformat(request["deadline"])
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
    actions = driver.episode(
        driver.event_raised(reply_event_name(step), reply(step, "failed", permanent=True, error="card declined"))
    )
    record = activity(actions, fn.RECORD_STEP_RESULT)
    assert json.loads(record["input"])["status"] == "failed"
    actions = driver.episode(driver.completed(record["taskId"], True))
    finish = json.loads(activity(actions, fn.FINISH_ORDER)["input"])
    assert finish["outcome"] == "failed" and "card declined" in finish["reason"] and step in finish["reason"]


def test_transient_failure_reply_leaves_recovery_to_the_supervisor(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    start_step(driver, actions, STEPS[0].value)
    actions = driver.episode(
        driver.event_raised(
            reply_event_name(STEPS[0].value), reply(STEPS[0].value, "failed", error="retries exhausted")
        )
    )
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
    driver: Driver, as_str: bool
) -> None:
    # azure-functions-durable-python #507: an event raised before its wait is buffered in `deferred_tasks` and, in
    # SDK 1.7.0, handed again to every later wait of its name; the wait loop must not spin on it (a RecursionError
    # in one episode) and must still take the valid reply raised after it. On devhost: tests/host/durable/
    # test_scheduler_events.py.
    def encoded(body: dict[str, Any]) -> Any:
        return json.dumps(body) if as_str else body

    step = STEPS[0].value
    name = reply_event_name(step)
    actions = driver.episode()
    load = activity(actions, fn.LOAD_ORDER)
    actions = driver.episode(
        driver.completed(load["taskId"], {"orderId": ORDER}),
        driver.event_raised(name, encoded({"instanceId": INSTANCE, "step": step})),
        driver.event_raised(name, encoded(reply(step, instance=f"{ORDER}:7"))),
    )
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


# Issue 11: the circuit breaker's "not now" (a CircuitOpen reply) and the steps an earlier attempt completed.


def circuit_open(step: str, retry_after: float | None = 12.5) -> dict[str, Any]:
    """The Agent's answer when the breaker refused and no remote call was made (orderflow/breaker.py)."""
    return {
        **reply(step, "failed", error="circuit breaker open"),
        "errorCode": "CircuitOpen",
        "result": {} if retry_after is None else {"retryAfterSeconds": retry_after},
    }


def scheduled(d: Driver, name: str) -> list[dict[str, Any]]:
    """The inputs of every call of activity `name` over the whole run."""
    return [json.loads(a["input"]) for a in d.scheduled if a["actionType"] in CALLS and a["functionName"] == name]


@pytest.mark.parametrize("step_index", [0, 1])
def test_a_circuit_open_reply_defers_the_order_without_a_failure(driver: Driver, step_index: int) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    for earlier in STEPS[:step_index]:  # earlier steps succeed
        start_step(driver, actions, earlier.value)
        actions = driver.episode(driver.event_raised(reply_event_name(earlier.value), reply(earlier.value)))
        actions = driver.episode(driver.completed(activity(actions, fn.RECORD_STEP_RESULT)["taskId"], True))
    step = STEPS[step_index].value
    timer = start_step(driver, actions, step)

    actions = driver.episode(driver.event_raised(reply_event_name(step), circuit_open(step)))

    defer = activity(actions, fn.DEFER_ORDER)
    request = json.loads(defer["input"])
    assert (request["orderId"], request["instanceId"], request["step"], request["retryAfterSeconds"]) == (
        ORDER,
        INSTANCE,
        step,
        12.5,
    )
    assert "CircuitOpen" in request["reason"]
    # retryAt from the orchestration's clock (deterministic), so a resent activity writes the same record
    assert datetime.fromisoformat(request["retryAt"]) == driver.now + timedelta(seconds=12.5)
    timers = [a for group in driver.result["actions"] for a in group if a.get("fireAt") == timer["fireAt"]]
    assert timers and all(t["isCanceled"] for t in timers)  # the reply won the race
    driver.episode(driver.completed(defer["taskId"], True))
    assert driver.done and driver.output == {"outcome": "deferred", "step": step}
    # Not recorded as the step's result, not finished (no FailureCount, no Error): the order waits in Pending.
    assert [r["step"] for r in scheduled(driver, fn.RECORD_STEP_RESULT)] == [s.value for s in STEPS[:step_index]]
    assert scheduled(driver, fn.FINISH_ORDER) == []
    assert len(scheduled(driver, fn.SEND_AGENT_REQUEST)) == step_index + 1  # no further step was sent


def test_a_circuit_open_reply_without_a_retry_time_waits_one_step_timeout(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    step = STEPS[0].value
    start_step(driver, actions, step)
    actions = driver.episode(driver.event_raised(reply_event_name(step), circuit_open(step, retry_after=None)))
    assert json.loads(activity(actions, fn.DEFER_ORDER)["input"])["retryAfterSeconds"] == 30


def test_a_fenced_deferral_reports_superseded(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    step = STEPS[0].value
    start_step(driver, actions, step)
    actions = driver.episode(driver.event_raised(reply_event_name(step), circuit_open(step)))
    driver.episode(driver.completed(activity(actions, fn.DEFER_ORDER)["taskId"], False))  # the lock moved on
    assert driver.done and driver.output == {"outcome": "superseded", "step": step}
    assert scheduled(driver, fn.FINISH_ORDER) == []


def test_an_ordinary_transient_failure_is_not_deferred(driver: Driver) -> None:
    """Only `CircuitOpen` (no call made) defers: a transient failure after calls stays the Supervisor's retry."""
    actions = driver.episode()
    actions = driver.episode(driver.completed(activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER}))
    step = STEPS[0].value
    start_step(driver, actions, step)
    driver.episode(driver.event_raised(reply_event_name(step), reply(step, "failed", error="503 from the remote")))
    assert driver.done and driver.output["outcome"] == "timedOut"
    assert scheduled(driver, fn.DEFER_ORDER) == []


def test_steps_an_earlier_attempt_completed_are_not_sent_again(driver: Driver) -> None:
    done = [STEPS[0].value, STEPS[1].value]
    actions = driver.episode()
    load = activity(actions, fn.LOAD_ORDER)
    actions = driver.episode(
        driver.completed(load["taskId"], {"orderId": ORDER, "currency": "EUR", "succeededSteps": done})
    )
    remaining = [s.value for s in STEPS if s.value not in done]
    for step in remaining:
        start_step(driver, actions, step)
        actions = driver.episode(driver.event_raised(reply_event_name(step), reply(step)))
        actions = driver.episode(driver.completed(activity(actions, fn.RECORD_STEP_RESULT)["taskId"], True))
    finish = activity(actions, fn.FINISH_ORDER)
    driver.episode(driver.completed(finish["taskId"], True))

    assert driver.done and driver.output == {"outcome": "completed"}
    assert [d["step"] for d in scheduled(driver, fn.SET_STEP_DEADLINE)] == remaining
    sent = scheduled(driver, fn.SEND_AGENT_REQUEST)
    assert [s["step"] for s in sent] == remaining
    for request in sent:  # the Agent gets the order as before, without the Scheduler's bookkeeping
        assert request["payload"] == {"orderId": ORDER, "currency": "EUR"}
        assert "succeededSteps" not in request["payload"]
    assert [r["step"] for r in scheduled(driver, fn.RECORD_STEP_RESULT)] == remaining


def test_an_order_whose_steps_all_succeeded_finishes_without_sending(driver: Driver) -> None:
    actions = driver.episode()
    actions = driver.episode(
        driver.completed(
            activity(actions, fn.LOAD_ORDER)["taskId"], {"orderId": ORDER, "succeededSteps": [s.value for s in STEPS]}
        )
    )
    finish = activity(actions, fn.FINISH_ORDER)
    assert json.loads(finish["input"])["outcome"] == "completed"
    driver.episode(driver.completed(finish["taskId"], True))
    assert driver.done and driver.output == {"outcome": "completed"}
    assert scheduled(driver, fn.SET_STEP_DEADLINE) == [] and scheduled(driver, fn.SEND_AGENT_REQUEST) == []


# The activities behind those Scheduler paths (activities/state.py, activities/frozen_versions.py), over the embedded
# store.


def _activity_function(name: str) -> Any:
    """The activity as the worker calls it, from its blueprint (`app.get_functions()` may be called once per app)."""
    from support.product_app import user_function

    return user_function(name)


async def _claimed_services(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, succeeded: int = 0) -> Any:
    """Services on a fresh store holding ORDER claimed by INSTANCE (attempt 1, FailureCount 1), the first
    `succeeded` steps recorded succeeded by an earlier attempt. No bus: these activities send nothing."""
    from datetime import timedelta

    from orderflow import runtime
    from orderflow.clock import FakeClock
    from orderflow.embedded.store import open_sqlite_stores
    from orderflow.messages import SubmitOrder
    from orderflow.records import OrderRecord, OrderStateRecord, StepStatus
    from orderflow.runtime import Services, Tunables
    from orderflow.state_machine import claim

    orders, state = open_sqlite_stores(tmp_path / "s.db")
    services = Services(orders=orders, state=state, bus=None, tunables=Tunables.from_env({}), clock=FakeClock())
    now = services.clock.now()
    order = SubmitOrder.model_validate(
        {
            "orderId": ORDER,
            "replyTo": "app-status",
            "customer": {"id": "c-1", "name": "Ada"},
            "items": [{"sku": "SKU-001", "quantity": 2, "unitPrice": "9.99"}],
            "currency": "EUR",
            "submittedAt": "2024-01-01T00:00:00+00:00",
        }
    )
    await orders.create_if_absent(OrderRecord.from_order(order, now))
    rec = claim(OrderStateRecord.new(order, now), INSTANCE, now + timedelta(seconds=30), now)
    steps = tuple(
        s.model_copy(update={"status": StepStatus.SUCCEEDED}) if i < succeeded else s for i, s in enumerate(rec.steps)
    )
    await state.create_if_absent(rec.model_copy(update={"failure_count": 1, "steps": steps}))

    monkeypatch.setattr(runtime, "_services", {})  # the original is restored after the test
    runtime.use_services(services)  # what the activities' get_services() returns on this loop
    return services


async def test_defer_order_returns_the_order_to_pending_without_a_failure(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from orderflow.records import ProcessState

    services = await _claimed_services(tmp_path, monkeypatch)
    defer_order = _activity_function(fn.DEFER_ORDER)
    request = {
        "orderId": ORDER,
        "instanceId": INSTANCE,
        "step": STEPS[0].value,
        "retryAfterSeconds": 12.5,
        "reason": "reserve-inventory: CircuitOpen: circuit breaker open",
    }

    assert await defer_order(dict(request, instanceId=f"{ORDER}:2")) is False  # not the lock holder: fenced
    assert await defer_order(request) is True

    rec, _ = await services.state.get(ORDER)
    assert (rec.process_state, rec.locked_by, rec.complete_by) == (ProcessState.PENDING, None, None)
    assert rec.failure_count == 1 and rec.deferrals == 1  # no attempt burned, one deferral counted
    assert rec.retry_at == services.clock.now() + timedelta(seconds=12.5)  # waits for the breaker's cool-down
    assert rec.last_error == request["reason"]
    assert await services.state.query_claimable(services.clock.now(), 10) == []  # not before retryAt
    assert len(await services.state.query_claimable(rec.retry_at, 10)) == 1
    assert await defer_order(request) is True  # a resend of the same deferral (activity retry) changes nothing
    assert (await services.state.get(ORDER))[0].deferrals == 1


async def test_a_resent_deferral_a_second_later_is_still_deferred(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Scheduler sends retryAt from the orchestration's clock: the activity retry (1 s later) writes the same
    record and reports True, so the orchestration ends `deferred`, not `superseded`."""
    from datetime import timedelta

    services = await _claimed_services(tmp_path, monkeypatch)
    defer_order = _activity_function(fn.DEFER_ORDER)
    retry_at = services.clock.now() + timedelta(seconds=12.5)
    request = {
        "orderId": ORDER,
        "instanceId": INSTANCE,
        "step": STEPS[0].value,
        "retryAfterSeconds": 12.5,
        "retryAt": retry_at.isoformat(),
        "reason": "reserve-inventory: CircuitOpen: open",
    }
    assert await defer_order(request) is True
    services.clock.advance(1)  # type: ignore[attr-defined]
    assert await defer_order(request) is True
    rec, _ = await services.state.get(ORDER)
    assert rec.retry_at == retry_at and rec.deferrals == 1


async def test_load_order_lists_the_steps_an_earlier_attempt_completed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _claimed_services(tmp_path, monkeypatch, succeeded=2)
    loaded = await _activity_function(fn.LOAD_ORDER)({"orderId": ORDER, "instanceId": INSTANCE})
    assert loaded["succeededSteps"] == [STEPS[0].value, STEPS[1].value]
    assert loaded["orderId"] == ORDER and loaded["currency"] == "EUR"


async def test_a_deferral_frees_the_admission_slot_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The activity that writes an order's exit from Processing frees its admission slot (orderflow/admission.py);
    a resend that writes nothing frees nothing."""
    from orderflow import admission

    services = await _claimed_services(tmp_path, monkeypatch)
    await admission.refresh(services)  # counts the claimed order: 1 slot taken
    services.clock.advance(1)
    assert (await admission.read_figures(services))[0].processing == 1
    request = {
        "orderId": ORDER,
        "instanceId": INSTANCE,
        "step": STEPS[0].value,
        "retryAfterSeconds": 5,
        "retryAt": (services.clock.now() + timedelta(seconds=5)).isoformat(),
        "reason": "CircuitOpen",
    }
    defer_order = _activity_function(fn.DEFER_ORDER)
    assert await defer_order(request) is True
    await admission.flush(services)  # the exit is deferred (admission.exited): written with the next write
    assert (await admission.read_figures(services))[0].processing == 0
    await admission.reserve(services)  # another order takes the slot
    assert await defer_order(request) is True  # the activity's resend: nothing written, nothing freed
    await admission.flush(services)
    assert (await admission.read_figures(services))[0].processing == 1
