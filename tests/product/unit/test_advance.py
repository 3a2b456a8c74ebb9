"""orderflow.advance: one Scheduler decision (workflow version 3) as one composed, fenced record change.

Each decision is made of the state machine's own transitions (record_step, begin_compensation, set_step_deadline,
complete, fail), so the transition table still governs every move; what is new is that they land in one write, and
that re-applying a decision to the record it produced changes nothing (a repeated activity writes nothing).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.state_records import FIRST, LEASE, NOW, pending

from orderflow.advance import StepResult, advance
from orderflow.messages import STEPS, CompensationName, StepName
from orderflow.records import OrderStateRecord, ProcessState, StepStatus, instance_id
from orderflow.state_machine import Fenced, claim, record_step, request_cancel, set_step_deadline

V3 = "3.0"
RESERVE, CHARGE, SHIP = STEPS
BY = NOW + timedelta(seconds=30)


def claimed() -> OrderStateRecord:
    return claim(pending(), FIRST, NOW + LEASE, NOW)


def ok(action: StepName | CompensationName, undone: bool | None = None) -> StepResult:
    return StepResult(action, True, undone=undone)


def refused(action: StepName | CompensationName) -> StepResult:
    return StepResult(action, False, error="declined", cause=f"{action.value}: Declined: declined")


def decide(
    rec: OrderStateRecord, result: StepResult | None = None, *, cancel: bool = False, by: object = BY
) -> tuple[OrderStateRecord, StepName | CompensationName | None]:
    """One decision, and a check that repeating it on its own output changes nothing (the activity's idempotency)."""
    decision = advance(rec, FIRST, result, by, NOW, V3, cancel)  # type: ignore[arg-type]
    again = advance(decision.record, FIRST, result, by, NOW, V3, cancel)  # type: ignore[arg-type]
    assert again.record is decision.record and again.send == decision.send
    return decision.record, decision.send


def test_the_first_decision_starts_the_first_step_with_the_schedulers_complete_by() -> None:
    rec, send = decide(claimed())
    assert send is RESERVE
    assert rec.process_state is ProcessState.PROCESSING and rec.complete_by == BY
    assert rec.step(RESERVE).status is StepStatus.RUNNING and rec.workflow_version == V3


def test_each_success_is_recorded_with_the_next_step_in_the_same_change_and_the_last_completes() -> None:
    rec, send = decide(claimed())
    for step, following in ((RESERVE, CHARGE), (CHARGE, SHIP)):
        rec, send = decide(rec, ok(step))
        assert send is following
        assert rec.step(step).status is StepStatus.SUCCEEDED and rec.step(following).status is StepStatus.RUNNING
    rec, send = decide(rec, ok(SHIP))
    assert send is None and rec.process_state is ProcessState.PROCESSED and rec.complete_by is None
    assert all(s.status is StepStatus.SUCCEEDED for s in rec.steps)


def test_a_record_walks_its_own_steps_not_the_codes() -> None:
    """A record created when the code had fewer steps (here: two) ends after them: the steps a deployment adds to
    STEPS never reach an order already in flight (README, "Versioning", adding a step)."""
    rec = claimed()
    rec = rec.model_copy(update={"steps": rec.steps[:2]})
    rec, send = decide(rec)
    rec, send = decide(rec, ok(RESERVE))
    assert send is CHARGE
    rec, send = decide(rec, ok(CHARGE))
    assert send is None and rec.process_state is ProcessState.PROCESSED
    assert [s.name for s in rec.steps] == [RESERVE, CHARGE]


def test_a_later_attempt_starts_at_the_first_step_not_yet_succeeded() -> None:
    rec = claimed()
    rec = record_step(set_step_deadline(rec, FIRST, RESERVE, BY, NOW), FIRST, RESERVE, StepStatus.SUCCEEDED, NOW)
    second = instance_id(rec.order_id, 2)
    rec = claim(
        rec.model_copy(update={"process_state": ProcessState.PENDING, "locked_by": None}), second, NOW + LEASE, NOW
    )
    decision = advance(rec, second, None, BY, NOW, V3)
    assert decision.send is CHARGE and decision.record.step(RESERVE).status is StepStatus.SUCCEEDED


def test_a_permanent_failure_begins_compensation_of_what_was_sent_and_dispatches_the_first_undo() -> None:
    rec, _ = decide(claimed())
    rec, _ = decide(rec, ok(RESERVE))
    rec, send = decide(rec, refused(CHARGE))
    assert rec.process_state is ProcessState.COMPENSATING
    assert rec.step(CHARGE).status is StepStatus.FAILED and rec.last_error == "charge-payment: Declined: declined"
    assert send is CompensationName.RELEASE_INVENTORY  # the refused charge had no effect: not compensated
    assert rec.compensation(CompensationName.RELEASE_INVENTORY).status is StepStatus.RUNNING
    rec, send = decide(rec, ok(CompensationName.RELEASE_INVENTORY, undone=True))
    assert send is None and rec.process_state is ProcessState.COMPENSATED
    assert rec.compensation(CompensationName.RELEASE_INVENTORY).undone is True


def test_a_failure_of_the_first_step_ends_in_error_with_nothing_to_undo() -> None:
    rec, _ = decide(claimed())
    rec, send = decide(rec, refused(RESERVE))
    assert send is None and rec.process_state is ProcessState.ERROR
    assert rec.last_error == "reserve-inventory: Declined: declined"


def test_a_permanent_compensation_failure_ends_in_compensation_failed() -> None:
    rec, _ = decide(claimed())
    rec, _ = decide(rec, ok(RESERVE))
    rec, _ = decide(rec, refused(CHARGE))
    rec, send = decide(rec, refused(CompensationName.RELEASE_INVENTORY))
    assert send is None and rec.process_state is ProcessState.COMPENSATION_FAILED


def test_a_cancel_recorded_while_a_step_ran_is_honoured_at_the_next_decision() -> None:
    rec, _ = decide(claimed())
    rec = request_cancel(rec, NOW, "changed my mind")
    rec, send = decide(rec, ok(RESERVE))
    assert rec.process_state is ProcessState.COMPENSATING and send is CompensationName.RELEASE_INVENTORY
    assert rec.compensation_cause == "cancelled: changed my mind"


def test_a_cancel_that_won_the_race_undoes_the_step_in_flight() -> None:
    rec, _ = decide(claimed())
    rec, send = decide(request_cancel(rec, NOW), cancel=True)
    assert rec.process_state is ProcessState.COMPENSATING and send is CompensationName.RELEASE_INVENTORY


def test_a_cancel_before_anything_was_sent_ends_cancelled() -> None:
    rec, send = decide(request_cancel(claimed(), NOW), cancel=True)
    assert send is None and rec.process_state is ProcessState.CANCELLED


def test_a_cancel_after_the_last_step_undoes_every_step() -> None:
    rec, _ = decide(claimed())
    rec, _ = decide(rec, ok(RESERVE))
    rec, _ = decide(rec, ok(CHARGE))
    rec, send = decide(request_cancel(rec, NOW), ok(SHIP))
    assert rec.process_state is ProcessState.COMPENSATING and send is CompensationName.CANCEL_SHIPMENT
    assert [c.name for c in rec.compensations] == [
        CompensationName.CANCEL_SHIPMENT,
        CompensationName.REFUND_PAYMENT,
        CompensationName.RELEASE_INVENTORY,
    ]


def test_a_superseded_attempt_is_fenced_out_and_changes_nothing() -> None:
    rec, _ = decide(claimed())
    with pytest.raises(Fenced):
        advance(rec, instance_id(rec.order_id, 2), ok(RESERVE), BY, NOW, V3)


def test_a_new_complete_by_for_the_same_step_is_a_new_deadline_not_a_repeat() -> None:
    rec, _ = decide(claimed())
    later = BY + timedelta(seconds=5)
    moved = advance(rec, FIRST, None, later, NOW, V3)
    assert moved.send is RESERVE and moved.record.complete_by == later
