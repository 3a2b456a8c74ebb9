"""Compensation on the embedded store and broker: the version-2 Scheduler's activities (activities/frozen_versions.py)
called as the worker calls them, the Starter claiming a compensation, and the Supervisor recovering one.

BEGIN_COMPENSATION moves a running attempt from Processing to CompensationInProgress (its admission slot is freed
there, once) and answers the compensations of the steps sent, newest first; with nothing sent the order ends
Cancelled (a cancel) or Error (a failure) and its terminal status goes out. FINISH_ORDER ends a compensation
Compensated (status `compensated` with the effects applied and undone; an operator alert when a failure caused it, none
for a cancel) or CompensationFailed (status `compensation-failed` and a CompensationFailed alert). The Supervisor
recovers an expired compensation on its own failure budget (compensationFailures), and at FailureThreshold moves a
Processing record whose steps were sent into compensation instead of Error.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from support.integration_support import (
    Pipeline,
    RecordingStartNew,
    claim_orders,
    run_action,
    state_activity,
    state_of,
    submit_orders,
)

from orderflow import admission
from orderflow import function_names as fn
from orderflow.messages import AlertKind, OrderStatus
from orderflow.records import ProcessState, StepStatus, format_utc
from orderflow.starter import run_starter
from orderflow.state_machine import claim
from orderflow.supervisor import run_supervisor
from orderflow.workflow import WORKFLOW_VERSION

ORDER = "o-1"
FIRST = f"{ORDER}:1"
RESERVE, CHARGE, SHIP = "reserve-inventory", "charge-payment", "arrange-shipping"
REFUND, RELEASE = "refund-payment", "release-inventory"
SHIP_FAILED = f"{SHIP}: Declined: no carrier for the address"


async def begin(p: Pipeline, cause: str, instance: str = FIRST, order_id: str = ORDER) -> Any:
    complete_by = p.clock.now() + p.services.tunables.step_timeout
    return await state_activity(fn.BEGIN_COMPENSATION)(
        {"orderId": order_id, "instanceId": instance, "cause": cause, "completeBy": format_utc(complete_by)}
    )


async def finish(p: Pipeline, outcome: str, reason: str, instance: str = FIRST, order_id: str = ORDER) -> Any:
    return await state_activity(fn.FINISH_ORDER)(
        {
            "orderId": order_id,
            "instanceId": instance,
            "attempt": int(instance.rsplit(":", 1)[1]),
            "outcome": outcome,
            "reason": reason,
        }
    )


async def shipping_failed_after_two_successes(p: Pipeline) -> None:
    """Attempt 1 (claimed by the Starter): reserve-inventory and charge-payment succeed, arrange-shipping fails
    permanently (as RECORD_STEP_RESULT records it)."""
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE)
    await run_action(p, ORDER, FIRST, CHARGE)
    await run_action(p, ORDER, FIRST, SHIP, "failed", error="no carrier for the address")


async def counted(p: Pipeline) -> None:
    """A Starter's refresh once the claims' reservations are past RESERVATION_GRACE: the figure is the count."""
    p.clock.advance(admission.RESERVATION_GRACE + timedelta(seconds=1))
    await admission.refresh(p.services)
    p.clock.advance(1)


async def processing_slots(p: Pipeline) -> int:
    """The stored Processing figure once this process's deferred exits are written (admission.exited)."""
    await admission.flush(p.services)
    return (await admission.read_figures(p.services))[0].processing


def terminal(statuses: list[Any]) -> list[Any]:
    return [s for s in statuses if s.state not in (OrderStatus.RECEIVED, OrderStatus.PROCESSING)]


# --- BEGIN_COMPENSATION ---------------------------------------------------------------------------------------------


async def test_begin_compensation_moves_processing_to_compensating_and_answers_newest_first(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    complete_by = p.clock.now() + p.services.tunables.step_timeout

    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]  # the refused step applied nothing: not compensated

    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.complete_by) == (ProcessState.COMPENSATING, FIRST, complete_by)
    assert rec.compensation_cause == SHIP_FAILED and rec.last_error == SHIP_FAILED
    assert [(c.name.value, c.step.value, c.status) for c in rec.compensations] == [
        (REFUND, CHARGE, StepStatus.PENDING),
        (RELEASE, RESERVE, StepStatus.PENDING),
    ]
    assert rec.workflow_version == WORKFLOW_VERSION and rec.failure_count == 0
    assert terminal(await p.statuses(ORDER)) == [] and await p.alerts() == []  # nothing ended yet

    # The activity's retry: the same answer, nothing written.
    found = await p.services.state.get(ORDER)
    assert found is not None
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    assert (await p.services.state.get(ORDER)) == found
    # A compensation attempt claimed later reads its plan from LOAD_ORDER.
    loaded = await state_activity(fn.LOAD_ORDER)({"orderId": ORDER, "instanceId": FIRST})
    assert loaded["plan"] == {"compensations": [REFUND, RELEASE]}
    assert loaded["succeededSteps"] == [RESERVE, CHARGE]


async def test_begin_compensation_of_another_instance_is_fenced(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    assert await begin(p, SHIP_FAILED, instance=f"{ORDER}:2") is None
    assert (await state_of(p, ORDER)).process_state is ProcessState.PROCESSING


async def test_a_failure_with_nothing_sent_ends_in_error_with_its_status_and_alert(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE, "failed", error="out of stock")
    cause = f"{RESERVE}: Declined: out of stock"

    assert await begin(p, cause) == []

    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.complete_by, rec.last_error) == (ProcessState.ERROR, None, cause)
    assert rec.compensations == () and rec.notified_at is not None
    [status] = terminal(await p.statuses(ORDER))
    assert (status.state, status.reason, status.attempt, status.effects) == (OrderStatus.FAILED, cause, 1, None)
    [alert] = await p.alerts()
    assert (alert.kind, alert.order_id, alert.reason) == (AlertKind.ORDER_FAILED, ORDER, cause)


async def test_a_repeated_begin_compensation_that_ended_in_error_is_a_no_op(p: Pipeline) -> None:
    """The Scheduler calls every activity with retries and Durable runs an activity at least once: a repeat of the
    BEGIN_COMPENSATION that ended the order in Error must answer [] again (as a cancel's does), send nothing and free
    no slot, not raise (three raises fail the orchestration)."""
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE, "failed", error="out of stock")
    cause = f"{RESERVE}: Declined: out of stock"
    await counted(p)
    assert await begin(p, cause) == []
    await admission.reserve(p.services)
    assert await processing_slots(p) == 1

    assert await begin(p, cause) == []

    assert await processing_slots(p) == 1
    assert len(terminal(await p.statuses(ORDER))) == 1 and len(await p.alerts()) == 1


async def test_a_cancel_with_nothing_sent_ends_cancelled_without_an_alert(p: Pipeline) -> None:
    await claim_orders(p, ORDER)

    assert await begin(p, "cancelled") == []

    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.complete_by, rec.compensation_cause) == (ProcessState.CANCELLED, None, "cancelled")
    assert rec.last_error is None
    [status] = terminal(await p.statuses(ORDER))
    assert (status.state, status.reason, status.effects) == (OrderStatus.CANCELLED, "cancelled", None)
    assert await p.alerts() == []


# --- FINISH_ORDER of a compensation ---------------------------------------------------------------------------------


async def test_a_compensated_failure_announces_the_effects_and_raises_order_failed(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    await run_action(p, ORDER, FIRST, REFUND, undone=True, honours_cancel=False)
    await run_action(p, ORDER, FIRST, RELEASE, undone=False, honours_cancel=False)  # found nothing to release

    assert await finish(p, "completed", "compensated") is True

    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.complete_by, rec.locked_by) == (ProcessState.COMPENSATED, None, FIRST)
    assert [(c.name.value, c.status, c.undone) for c in rec.compensations] == [
        (REFUND, StepStatus.SUCCEEDED, True),
        (RELEASE, StepStatus.SUCCEEDED, False),
    ]
    [status] = terminal(await p.statuses(ORDER))
    assert (status.state, status.reason, status.attempt) == (OrderStatus.COMPENSATED, SHIP_FAILED, 1)
    assert status.effects is not None
    assert ([s.value for s in status.effects.applied], [s.value for s in status.effects.undone]) == (
        [RESERVE, CHARGE],
        [CHARGE],
    )
    [alert] = await p.alerts()
    assert (alert.kind, alert.order_id, alert.reason) == (AlertKind.ORDER_FAILED, ORDER, SHIP_FAILED)
    assert (alert.details["applied"], alert.details["undone"]) == ([RESERVE, CHARGE], [CHARGE])
    assert rec.notified_at is not None
    assert await finish(p, "completed", "compensated") is True  # the activity's retry: nothing sent again
    assert len(terminal(await p.statuses(ORDER))) == 1 and len(await p.alerts()) == 1


async def test_a_compensated_cancel_announces_the_effects_without_an_alert(p: Pipeline) -> None:
    """The cancel won the race while charge-payment was in flight: both sent steps are compensated; the remote had
    not applied the charge (undone false), so only the reservation was applied, and undone."""
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE)
    await run_action(p, ORDER, FIRST, CHARGE, None)  # in flight
    assert await begin(p, "cancelled") == [REFUND, RELEASE]
    assert (await state_of(p, ORDER)).last_error is None  # a cancel is not an error
    await run_action(p, ORDER, FIRST, REFUND, undone=False, honours_cancel=False)
    await run_action(p, ORDER, FIRST, RELEASE, undone=True, honours_cancel=False)

    assert await finish(p, "completed", "compensated") is True

    assert (await state_of(p, ORDER)).process_state is ProcessState.COMPENSATED
    [status] = terminal(await p.statuses(ORDER))
    assert (status.state, status.reason) == (OrderStatus.COMPENSATED, "cancelled")
    assert status.effects is not None
    assert ([s.value for s in status.effects.applied], [s.value for s in status.effects.undone]) == (
        [RESERVE],
        [RESERVE],
    )
    assert await p.alerts() == []


async def test_a_compensation_that_fails_ends_compensation_failed_with_an_alert(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    await run_action(p, ORDER, FIRST, REFUND, "failed", honours_cancel=False, error="refund window closed")
    reason = f"{REFUND}: RefundRefused: refund window closed"

    assert await finish(p, "failed", reason) is True

    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.last_error, rec.complete_by) == (ProcessState.COMPENSATION_FAILED, reason, None)
    [status] = terminal(await p.statuses(ORDER))
    assert status.state is OrderStatus.COMPENSATION_FAILED
    assert status.reason == f"{reason} (after: {SHIP_FAILED})"
    assert status.effects is not None
    assert ([s.value for s in status.effects.applied], status.effects.undone) == ([RESERVE, CHARGE], [])
    [alert] = await p.alerts()
    assert (alert.kind, alert.order_id, alert.reason) == (AlertKind.COMPENSATION_FAILED, ORDER, status.reason)
    assert (alert.details["applied"], alert.details["undone"]) == ([RESERVE, CHARGE], [])


async def test_a_compensation_cannot_finish_completed_before_every_compensation_succeeded(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    await run_action(p, ORDER, FIRST, REFUND, undone=True, honours_cancel=False)
    with pytest.raises(Exception, match=RELEASE):
        await finish(p, "completed", "compensated")
    assert (await state_of(p, ORDER)).process_state is ProcessState.COMPENSATING
    assert terminal(await p.statuses(ORDER)) == []


async def test_a_step_cannot_be_sent_while_compensating(p: Pipeline) -> None:
    """A late forward step of the compensating attempt is refused by the record (a compensation is final)."""
    await shipping_failed_after_two_successes(p)
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    with pytest.raises(Exception, match="compensated"):
        await run_action(p, ORDER, FIRST, SHIP, None, honours_cancel=False)


# --- admission: the slot is freed once -----------------------------------------------------------------------------


async def test_the_admission_slot_is_freed_when_processing_ends_not_when_the_compensation_does(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    await counted(p)  # the claimed order: 1 slot taken
    assert await processing_slots(p) == 1

    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    assert await processing_slots(p) == 0  # Processing → CompensationInProgress frees it

    await admission.reserve(p.services)  # another order takes the slot
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]  # the activity's retry frees nothing
    await run_action(p, ORDER, FIRST, REFUND, undone=True, honours_cancel=False)
    await run_action(p, ORDER, FIRST, RELEASE, undone=True, honours_cancel=False)
    assert await finish(p, "completed", "compensated") is True
    assert await processing_slots(p) == 1  # the compensation's end frees nothing
    assert await p.services.state.count_in_state(ProcessState.PROCESSING) == 0


async def test_a_failed_compensation_frees_nothing_either(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    await counted(p)
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    assert await processing_slots(p) == 0
    await admission.reserve(p.services)
    await run_action(p, ORDER, FIRST, REFUND, "failed", honours_cancel=False, error="no")
    assert await finish(p, "failed", f"{REFUND}: PermanentFailure: no") is True
    assert await processing_slots(p) == 1


@pytest.mark.parametrize("cause", ["cancelled", f"{RESERVE}: Declined: out of stock"])
async def test_ending_with_nothing_sent_frees_the_slot(p: Pipeline, cause: str) -> None:
    await claim_orders(p, ORDER)
    if cause != "cancelled":
        await run_action(p, ORDER, FIRST, RESERVE, "failed", error="out of stock")
    await counted(p)
    assert await processing_slots(p) == 1
    assert await begin(p, cause) == []
    assert await processing_slots(p) == 0
    if cause == "cancelled":  # the failure's repeat: test_a_repeated_begin_compensation_that_ended_in_error_is_a_no_op
        await admission.reserve(p.services)
        assert await begin(p, cause) == []  # the activity's retry frees nothing
        assert await processing_slots(p) == 1


# --- the Starter claims a compensation ------------------------------------------------------------------------------


async def compensating_unlocked(p: Pipeline) -> None:
    """FailureThreshold 1: attempt 1 sent reserve-inventory and expired; the Supervisor moved the order into
    compensation, unlocked (the Starter claims it)."""
    p.services.tunables = replace(p.services.tunables, failure_threshold=1)
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE, None)  # in flight when the attempt expired
    p.clock.advance(p.services.tunables.step_timeout + timedelta(seconds=1))
    run = await run_supervisor(p.services)
    assert run.recovered == [ORDER] and run.escalated == []


async def test_at_the_threshold_a_processing_order_with_a_step_sent_is_compensated_not_failed(p: Pipeline) -> None:
    await admission.refresh(p.services)
    await compensating_unlocked(p)

    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.complete_by, rec.retry_at) == (
        ProcessState.COMPENSATING,
        None,
        None,
        None,
    )
    assert rec.failure_count == 1 and rec.compensation_failures == 0
    assert (rec.compensation_cause or "").startswith(
        "FailureThresholdReached"
    ) and rec.last_error == rec.compensation_cause
    assert [(c.name.value, c.step.value) for c in rec.compensations] == [(RELEASE, RESERVE)]
    assert terminal(await p.statuses(ORDER)) == [] and await p.alerts() == []  # not ended: no status, no alert
    assert await processing_slots(p) == 0  # it left Processing


async def test_the_starter_claims_a_compensation_without_an_admission_slot(p: Pipeline) -> None:
    await compensating_unlocked(p)
    start = RecordingStartNew()

    run = await run_starter(p.services, start)

    assert run.claimed == [f"{ORDER}:2"] and run.not_admitted == 0
    [(name, instance, inp)] = start.calls
    assert (name, instance) == (fn.ORDER_WORKFLOW, f"{ORDER}:2")
    assert (inp["attempt"], inp["workflowVersion"]) == (2, WORKFLOW_VERSION)
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.attempt) == (ProcessState.COMPENSATING, f"{ORDER}:2", 2)
    figures, _ = await admission.read_figures(p.services)
    assert (figures.processing, figures.reserved) == (0, ())  # no slot reserved for it
    loaded = await state_activity(fn.LOAD_ORDER)({"orderId": ORDER, "instanceId": f"{ORDER}:2"})
    assert loaded["plan"] == {"compensations": [RELEASE]}

    # Attempt 2 runs the compensation; a failure at the threshold caused it: FailureThresholdReached is raised.
    await run_action(p, ORDER, f"{ORDER}:2", RELEASE, undone=True, honours_cancel=False)
    assert await finish(p, "completed", "compensated", instance=f"{ORDER}:2") is True
    [status] = terminal(await p.statuses(ORDER))
    assert (status.state, status.attempt) == (OrderStatus.COMPENSATED, 2)
    assert status.effects is not None and [s.value for s in status.effects.undone] == [RESERVE]
    [alert] = await p.alerts()
    assert alert.kind is AlertKind.FAILURE_THRESHOLD and alert.details["undone"] == [RESERVE]


async def test_the_starter_claims_a_compensation_while_processing_is_full(p: Pipeline) -> None:
    """A compensation needs no admission slot (orderflow/starter.py `_claim_within_the_bound`): Processing at
    MaxOrdersInProcessing must not hold it back."""
    await compensating_unlocked(p)
    p.services.tunables = replace(p.services.tunables, max_in_processing=1)
    await submit_orders(p, "o-2")
    now = p.clock.now()
    await p.services.state.update_with_retry(  # o-2 is Processing: the one slot is taken
        "o-2", lambda r: claim(r, "o-2:1", now + p.services.tunables.claim_lease, now)
    )
    start = RecordingStartNew()

    run = await run_starter(p.services, start)

    assert (await admission.read_figures(p.services))[0].processing == 1
    assert run.claimed == [f"{ORDER}:2"], run
    assert (await state_of(p, ORDER)).locked_by == f"{ORDER}:2"


# --- the Supervisor recovers an expired compensation ----------------------------------------------------------------


async def test_an_expired_compensation_is_retried_on_its_own_failure_budget(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    await run_action(p, ORDER, FIRST, REFUND, None, honours_cancel=False)  # no reply before CompleteBy
    await counted(p)
    p.clock.advance(p.services.tunables.step_timeout + timedelta(seconds=1))
    await admission.reserve(p.services)  # one slot held by another order

    run = await run_supervisor(p.services)

    assert run.recovered == [ORDER] and run.escalated == []
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.complete_by) == (ProcessState.COMPENSATING, None, None)
    assert rec.compensation_failures == 1 and rec.failure_count == 0
    assert rec.retry_at == p.clock.now() + p.services.tunables.backoff(1)
    assert FIRST in (rec.last_error or "") and rec.compensation_cause == SHIP_FAILED
    assert await processing_slots(p) == 1  # a compensation holds no slot: nothing freed
    assert terminal(await p.statuses(ORDER)) == [] and await p.alerts() == []
    assert (await run_starter(p.services, RecordingStartNew())).claimed == []  # not before its retryAt
    p.clock.set(rec.retry_at)
    assert (await run_starter(p.services, RecordingStartNew())).claimed == [f"{ORDER}:2"]


async def test_a_compensation_expiring_at_the_threshold_ends_compensation_failed_with_an_alert(p: Pipeline) -> None:
    await shipping_failed_after_two_successes(p)
    assert await begin(p, SHIP_FAILED) == [REFUND, RELEASE]
    threshold = p.services.tunables.failure_threshold
    for failures in range(1, threshold + 1):
        p.clock.advance(max(p.services.tunables.step_timeout, p.services.tunables.claim_lease) + timedelta(seconds=1))
        run = await run_supervisor(p.services)
        rec = await state_of(p, ORDER)
        assert rec.compensation_failures == failures
        if failures < threshold:
            assert run.recovered == [ORDER] and rec.process_state is ProcessState.COMPENSATING
            assert rec.retry_at is not None
            p.clock.set(rec.retry_at)
            assert (await run_starter(p.services, RecordingStartNew())).claimed == [f"{ORDER}:{failures + 1}"]
    assert run.escalated == [ORDER]
    assert rec.process_state is ProcessState.COMPENSATION_FAILED and rec.locked_by is None
    assert (rec.last_error or "").startswith("CompensationThresholdReached")
    assert rec.failure_count == 0 and rec.notified_at is not None
    [status] = terminal(await p.statuses(ORDER))
    assert status.state is OrderStatus.COMPENSATION_FAILED and status.attempt == threshold
    assert status.reason.endswith(f"(after: {SHIP_FAILED})")
    [alert] = await p.alerts()
    assert (alert.kind, alert.order_id) == (AlertKind.COMPENSATION_FAILED, ORDER)
    assert (alert.details["applied"], alert.details["undone"]) == ([RESERVE, CHARGE], [])
