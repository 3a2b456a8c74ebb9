"""Unit tests of the order state machine (orderflow.state_machine): every allowed and forbidden transition,
fencing, idempotent repeats, recovery with backoff, and invariants over random operation sequences."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.state_records import FIRST, LEASE, NOW, ORDER, in_state, pending

from orderflow.messages import MAX_ATTEMPT, STEPS, CompensationName, StepName
from orderflow.records import (
    ERROR_TEXT_MAX,
    MAX_PREVIOUS_ERRORS,
    MAX_RESUBMISSIONS,
    TERMINAL_STATES,
    OrderStateRecord,
    ProcessState,
    StepStatus,
    instance_id,
)
from orderflow.state_machine import (
    STEP_TRANSITIONS,
    TRANSITIONS,
    CancelRefused,
    Event,
    Fenced,
    IllegalTransition,
    NotDue,
    ResubmitRefused,
    begin_compensation,
    cancel,
    claim,
    complete,
    defer,
    exponential_backoff,
    fail,
    mark_notified,
    next_state,
    record_step,
    recover,
    request_cancel,
    restart,
    resubmit,
    set_step_deadline,
)

BACKOFF = exponential_backoff(2, 300)
THRESHOLD = 3
STEP = StepName.RESERVE_INVENTORY


# Each event as a call with valid arguments, so the only reason to refuse is the state (or the lock).
OPERATIONS: dict[Event, Callable[[OrderStateRecord], OrderStateRecord]] = {
    Event.CLAIM: lambda r: claim(r, instance_id(ORDER, r.attempt + 1), NOW + LEASE, NOW),
    Event.SET_STEP_DEADLINE: lambda r: set_step_deadline(r, FIRST, STEP, NOW + LEASE, NOW),
    Event.RECORD_STEP: lambda r: record_step(r, FIRST, STEP, StepStatus.RUNNING, NOW),
    Event.COMPLETE: lambda r: complete(r, FIRST, NOW),
    Event.FAIL: lambda r: fail(r, FIRST, "boom", NOW),
    Event.RECOVER_RETRY: lambda r: recover(r, FIRST, NOW, THRESHOLD, BACKOFF),
    Event.RECOVER_GIVE_UP: lambda r: recover(
        r.model_copy(update={"failure_count": THRESHOLD - 1}), FIRST, NOW, THRESHOLD, BACKOFF
    ),
    Event.DEFER: lambda r: defer(r, FIRST, NOW + LEASE, NOW, "reserve-inventory: CircuitOpen"),
    Event.RESTART: lambda r: restart(r, FIRST, NOW + LEASE, NOW),
    Event.RESUBMIT: lambda r: resubmit(r, NOW, "ops@example.com", "remote fixed"),
}
# Repeating the move that produced the state, by the same instance, returns the record unchanged.
IDEMPOTENT_REPEATS = {(ProcessState.PROCESSED, Event.COMPLETE), (ProcessState.ERROR, Event.FAIL)}


# The generic table test covers the events and states of the forward path; the compensation and cancel rows, whose
# target also depends on the record's data (which steps were sent), have their own tests below.
FORWARD_STATES = (ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.PROCESSED, ProcessState.ERROR)
UNDO_EVENTS = {Event.COMPENSATE, Event.CANCEL, Event.REQUEST_CANCEL}


def test_every_event_has_an_operation() -> None:
    assert set(OPERATIONS) | UNDO_EVENTS == set(Event)


@pytest.mark.parametrize("state", FORWARD_STATES)
@pytest.mark.parametrize("event", sorted(set(Event) - UNDO_EVENTS))
def test_transition_table(state: ProcessState, event: Event) -> None:
    rec = in_state(state)
    if (state, event) in TRANSITIONS:
        result = OPERATIONS[event](rec)
        assert result.process_state is TRANSITIONS[(state, event)]
        assert result.updated_at == NOW
    elif (state, event) in IDEMPOTENT_REPEATS:
        assert OPERATIONS[event](rec) is rec
    else:
        # A fenced call on a record the caller does not hold is Fenced before the state is even looked at.
        fenced = event not in (Event.CLAIM, Event.RESUBMIT)  # the Starter and an operator hold no lock yet
        expected = Fenced if fenced and rec.locked_by != FIRST else IllegalTransition
        with pytest.raises(expected):
            OPERATIONS[event](rec)


def test_next_state_names_the_refused_move() -> None:
    with pytest.raises(IllegalTransition, match="complete is not allowed in state Pending"):
        next_state(ProcessState.PENDING, Event.COMPLETE)


def test_terminal_states_have_no_way_out_but_an_operators_resubmit() -> None:
    terminal = {
        ProcessState.PROCESSED,
        ProcessState.ERROR,
        ProcessState.COMPENSATED,
        ProcessState.COMPENSATION_FAILED,
        ProcessState.CANCELLED,
    }
    assert sorted(key for key in TRANSITIONS if key[0] in terminal) == [
        (ProcessState.COMPENSATION_FAILED, Event.RESUBMIT),
        (ProcessState.ERROR, Event.RESUBMIT),
    ]


# --- resubmit (an operator's) ---------------------------------------------------------------------


def test_resubmit_of_an_error_runs_it_again_with_a_fresh_budget_and_an_audit_entry() -> None:
    failed = recover(
        in_state(ProcessState.PROCESSING).model_copy(update={"failure_count": THRESHOLD - 1}),
        FIRST,
        NOW,
        THRESHOLD,
        BACKOFF,
    )
    failed = failed.model_copy(update={"notified_at": NOW})
    assert failed.process_state is ProcessState.ERROR and failed.last_error is not None
    later = NOW + LEASE
    rec = resubmit(failed, later, "ops@example.com", "remote fixed")
    assert (
        rec.process_state,
        rec.locked_by,
        rec.complete_by,
        rec.retry_at,
        rec.failure_count,
        rec.notified_at,
        rec.last_error,
    ) == (ProcessState.PENDING, None, None, None, 0, None, None)
    assert rec.previous_errors[-1] == failed.last_error and rec.attempt == failed.attempt
    assert [(a.by, a.reason, a.at, a.from_state, a.failure_count) for a in rec.resubmissions] == [
        ("ops@example.com", "remote fixed", later, ProcessState.ERROR, THRESHOLD)
    ]
    # The Starter claims it as the next attempt (a new, attempt-specific instance id).
    assert (
        claim(rec, instance_id(ORDER, rec.attempt + 1), later + LEASE, later).process_state is ProcessState.PROCESSING
    )


def test_resubmit_of_a_failed_compensation_tries_the_compensation_again() -> None:
    rec = in_state(ProcessState.PROCESSING)
    rec = set_step_deadline(rec, FIRST, STEP, NOW + LEASE, NOW)
    rec = begin_compensation(rec, FIRST, "boom", NOW + LEASE, NOW)
    rec = fail(rec, FIRST, "undo refused", NOW).model_copy(update={"compensation_failures": 2, "failure_count": 1})
    assert rec.process_state is ProcessState.COMPENSATION_FAILED
    again = resubmit(rec, NOW, "ops", "undo by hand done")
    assert (again.process_state, again.locked_by, again.compensation_failures, again.failure_count) == (
        ProcessState.COMPENSATING,
        None,
        0,
        1,
    )
    assert again.resubmissions[0].failure_count == 2 and again.compensations == rec.compensations


@pytest.mark.parametrize("state", [ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.PROCESSED])
def test_resubmit_refuses_an_order_that_has_not_failed(state: ProcessState) -> None:
    with pytest.raises(ResubmitRefused, match=f"is {state.value}: only an order in Error or CompensationFailed"):
        resubmit(in_state(state), NOW, "ops", "why")


# --- claim ----------------------------------------------------------------------------------------


def test_claim_locks_for_the_next_attempt() -> None:
    rec = claim(pending(), FIRST, NOW + LEASE, NOW)
    assert (rec.process_state, rec.locked_by, rec.attempt, rec.complete_by) == (
        ProcessState.PROCESSING,
        FIRST,
        1,
        NOW + LEASE,
    )


def test_claim_requires_the_attempt_specific_instance_id() -> None:
    with pytest.raises(ValueError, match="o-1:1"):
        claim(pending(), instance_id(ORDER, 2), NOW + LEASE, NOW)


def test_claim_refuses_a_locked_record() -> None:
    with pytest.raises(IllegalTransition, match="locked"):
        claim(pending(locked_by="o-1:9"), FIRST, NOW + LEASE, NOW)


@pytest.mark.parametrize(
    "retry_at, due",
    [
        (NOW - timedelta(microseconds=1), True),
        (NOW, True),
        (NOW + timedelta(microseconds=1), False),
        (None, True),
    ],
)
def test_claim_honours_retry_at(retry_at: datetime | None, due: bool) -> None:
    rec = pending(retry_at=retry_at)
    if due:
        assert claim(rec, FIRST, NOW + LEASE, NOW).retry_at is None
    else:
        with pytest.raises(NotDue):
            claim(rec, FIRST, NOW + LEASE, NOW)


def test_claim_refuses_past_the_last_attempt() -> None:
    with pytest.raises(ValueError):
        claim(pending(attempt=MAX_ATTEMPT), instance_id(ORDER, MAX_ATTEMPT), NOW + LEASE, NOW)


# --- fencing --------------------------------------------------------------------------------------

FENCED_CALLS: dict[str, Callable[[OrderStateRecord, str], OrderStateRecord]] = {
    "set_step_deadline": lambda r, i: set_step_deadline(r, i, STEP, NOW + LEASE, NOW),
    "record_step": lambda r, i: record_step(r, i, STEP, StepStatus.RUNNING, NOW),
    "complete": lambda r, i: complete(r, i, NOW),
    "fail": lambda r, i: fail(r, i, "boom", NOW),
    "recover": lambda r, i: recover(r, i, NOW, THRESHOLD, BACKOFF),
}


@pytest.mark.parametrize("name", list(FENCED_CALLS))
def test_fenced_calls_refuse_another_instance(name: str) -> None:
    rec = in_state(ProcessState.PROCESSING)
    with pytest.raises(Fenced) as info:
        FENCED_CALLS[name](rec, instance_id(ORDER, 2))
    assert (info.value.expected, info.value.locked_by) == (instance_id(ORDER, 2), FIRST)
    assert not isinstance(info.value, IllegalTransition)  # a distinct exception, not a state error


@pytest.mark.parametrize("name", list(FENCED_CALLS))
def test_a_recovered_attempt_is_fenced_out(name: str) -> None:
    recovered = recover(in_state(ProcessState.PROCESSING), FIRST, NOW, THRESHOLD, BACKOFF)
    with pytest.raises(Fenced):
        FENCED_CALLS[name](recovered, FIRST)


# --- steps ----------------------------------------------------------------------------------------


def test_set_step_deadline_moves_complete_by_and_starts_the_step() -> None:
    rec = set_step_deadline(in_state(ProcessState.PROCESSING), FIRST, STEP, NOW + LEASE, NOW)
    step = rec.step(STEP)
    assert (rec.complete_by, step.status, step.attempt, step.started_at) == (
        NOW + LEASE,
        StepStatus.RUNNING,
        1,
        NOW,
    )
    assert set_step_deadline(rec, FIRST, STEP, NOW + LEASE, NOW + LEASE) is rec  # activity retry: no-op


@pytest.mark.parametrize("current", list(StepStatus))
@pytest.mark.parametrize("target", list(StepStatus))
def test_step_transition_table(current: StepStatus, target: StepStatus) -> None:
    base = in_state(ProcessState.PROCESSING)
    steps = tuple(s.model_copy(update={"status": current, "attempt": 1}) if s.name == STEP else s for s in base.steps)
    rec = base.model_copy(update={"steps": steps})
    if current is target and target is not StepStatus.RUNNING:
        assert record_step(rec, FIRST, STEP, target, NOW) is rec  # same outcome twice: no-op
    elif target in STEP_TRANSITIONS[current]:
        assert record_step(rec, FIRST, STEP, target, NOW).step(STEP).status is target
    else:
        with pytest.raises(IllegalTransition):
            record_step(rec, FIRST, STEP, target, NOW)


def test_record_step_keeps_the_error_and_times() -> None:
    rec = set_step_deadline(in_state(ProcessState.PROCESSING), FIRST, STEP, NOW + LEASE, NOW)
    done = record_step(rec, FIRST, STEP, StepStatus.FAILED, NOW + LEASE, error="declined")
    assert done.last_error == "declined"
    assert done.step(STEP).completed_at == NOW + LEASE and done.step(STEP).started_at == NOW


def test_a_step_from_an_earlier_attempt_must_restart_first() -> None:
    rec = set_step_deadline(in_state(ProcessState.PROCESSING), FIRST, STEP, NOW + LEASE, NOW)
    rec = record_step(rec, FIRST, STEP, StepStatus.SUCCEEDED, NOW)
    second = claim(
        recover(rec, FIRST, NOW + 2 * LEASE, THRESHOLD, BACKOFF),
        instance_id(ORDER, 2),
        NOW + 3 * LEASE,
        NOW + 2 * LEASE + BACKOFF(1),
    )
    with pytest.raises(IllegalTransition, match="must start"):
        record_step(second, instance_id(ORDER, 2), STEP, StepStatus.SUCCEEDED, NOW)
    restarted = set_step_deadline(second, instance_id(ORDER, 2), STEP, NOW + 4 * LEASE, NOW + 3 * LEASE)
    assert restarted.step(STEP).attempt == 2 and restarted.step(STEP).completed_at is None


def test_unknown_step_is_an_illegal_transition() -> None:
    """A record without the step (created before the step was added) refuses it as the state machine refuses a
    move, not with a KeyError."""
    rec = in_state(ProcessState.PROCESSING).model_copy(update={"steps": ()})
    with pytest.raises(IllegalTransition, match="has no step"):
        record_step(rec, FIRST, STEP, StepStatus.RUNNING, NOW)
    with pytest.raises(IllegalTransition, match="has no step"):
        rec.step(STEP)


# --- complete / fail ------------------------------------------------------------------------------


def test_complete_clears_the_deadline_and_keeps_the_lock() -> None:
    rec = complete(in_state(ProcessState.PROCESSING), FIRST, NOW)
    assert (rec.process_state, rec.locked_by, rec.complete_by) == (ProcessState.PROCESSED, FIRST, None)


def test_complete_moves_an_earlier_error_into_the_history() -> None:
    """A success after a failed attempt: the old error is history (previousErrors), not the current lastError."""
    retried = recover(in_state(ProcessState.PROCESSING), FIRST, NOW, THRESHOLD, BACKOFF)
    second = instance_id(ORDER, 2)
    rec = claim(retried, second, NOW + LEASE * 10, NOW + LEASE * 5)
    rec = record_step(
        set_step_deadline(rec, second, STEP, NOW + LEASE * 10, NOW + LEASE * 5),
        second,
        STEP,
        StepStatus.FAILED,
        NOW + LEASE * 5,
        error="timeout, retried",
    )
    expired = retried.last_error
    assert expired is not None and "expired" in expired
    done = complete(rec, second, NOW + LEASE * 6)
    assert (done.process_state, done.last_error) == (ProcessState.PROCESSED, None)
    assert done.previous_errors == (expired, "timeout, retried")
    assert complete(done, second, NOW + LEASE * 7) == done  # the repeat stays a no-op


def test_complete_without_an_error_leaves_the_history_empty() -> None:
    done = complete(in_state(ProcessState.PROCESSING), FIRST, NOW)
    assert (done.last_error, done.previous_errors) == (None, ())


def test_fail_records_the_error() -> None:
    rec = fail(in_state(ProcessState.PROCESSING), FIRST, "card declined", NOW)
    assert (rec.process_state, rec.last_error, rec.complete_by) == (ProcessState.ERROR, "card declined", None)


def test_fail_keeps_the_error_it_replaces_in_the_history() -> None:
    rec = record_step(
        set_step_deadline(in_state(ProcessState.PROCESSING), FIRST, STEP, NOW + LEASE, NOW),
        FIRST,
        STEP,
        StepStatus.FAILED,
        NOW,
        error="timeout",
    )
    out = fail(rec, FIRST, "card declined", NOW)
    assert (out.last_error, out.previous_errors) == ("card declined", ("timeout",))


# --- recover --------------------------------------------------------------------------------------


def test_recover_below_threshold_returns_to_pending_with_backoff() -> None:
    rec = recover(in_state(ProcessState.PROCESSING), FIRST, NOW, THRESHOLD, BACKOFF)
    assert (rec.process_state, rec.locked_by, rec.failure_count) == (ProcessState.PENDING, None, 1)
    assert rec.retry_at == NOW + timedelta(seconds=2) and rec.complete_by is None
    assert rec.attempt == 1 and "expired" in (rec.last_error or "")
    again = recover(
        claim(rec, instance_id(ORDER, 2), NOW + LEASE, rec.retry_at),
        instance_id(ORDER, 2),
        NOW + 2 * LEASE,
        THRESHOLD,
        BACKOFF,
    )
    assert (again.failure_count, again.retry_at) == (2, NOW + 2 * LEASE + timedelta(seconds=4))


def test_recover_at_threshold_gives_up() -> None:
    rec = in_state(ProcessState.PROCESSING).model_copy(update={"failure_count": THRESHOLD - 1})
    out = recover(rec, FIRST, NOW, THRESHOLD, BACKOFF)
    assert (out.process_state, out.failure_count, out.locked_by, out.retry_at) == (
        ProcessState.ERROR,
        THRESHOLD,
        None,
        None,
    )
    assert (out.last_error or "").startswith("FailureThresholdReached")


def test_recover_before_complete_by_expires_is_not_due() -> None:
    rec = set_step_deadline(in_state(ProcessState.PROCESSING), FIRST, STEP, NOW + LEASE, NOW)
    with pytest.raises(NotDue):
        recover(rec, FIRST, NOW + LEASE - timedelta(microseconds=1), THRESHOLD, BACKOFF)
    assert recover(rec, FIRST, NOW + LEASE, THRESHOLD, BACKOFF).process_state is ProcessState.PENDING


# --- backoff --------------------------------------------------------------------------------------


@pytest.mark.parametrize("failures, seconds", [(1, 2), (2, 4), (3, 8), (8, 256), (9, 300), (10_000, 300)])
def test_exponential_backoff_doubles_then_caps(failures: int, seconds: int) -> None:
    assert exponential_backoff(2, 300)(failures) == timedelta(seconds=seconds)


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        exponential_backoff(2, 300)(0)
    with pytest.raises(ValueError):
        exponential_backoff(-1, 300)


@given(st.floats(0, 1000), st.floats(0, 10_000), st.integers(1, 200))
def test_backoff_is_monotonic_and_bounded(base: float, cap: float, n: int) -> None:
    policy = exponential_backoff(base, cap)
    assert timedelta(0) <= policy(n) <= policy(n + 1) <= timedelta(seconds=cap)


# --- invariants over random sequences -------------------------------------------------------------


def _random_op(kind: str, rec: OrderStateRecord, now: datetime, step: StepName) -> OrderStateRecord:
    owner = rec.locked_by or instance_id(ORDER, max(rec.attempt, 1))
    calls: dict[str, Callable[[], OrderStateRecord]] = {
        "claim": lambda: claim(rec, instance_id(ORDER, rec.attempt + 1), now + LEASE, now),
        "deadline": lambda: set_step_deadline(rec, owner, step, now + LEASE, now),
        "ok": lambda: record_step(rec, owner, step, StepStatus.SUCCEEDED, now),
        "ko": lambda: record_step(rec, owner, step, StepStatus.FAILED, now, error="x"),
        "complete": lambda: complete(rec, owner, now),
        "fail": lambda: fail(rec, owner, "boom", now),
        "failbig": lambda: record_step(rec, owner, step, StepStatus.FAILED, now, error=f"{now}: " + "x " * 900),
        "recover": lambda: recover(rec, owner, now, THRESHOLD, BACKOFF),
        "notify": lambda: mark_notified(rec, now, 3600),
        "resubmit": lambda: resubmit(rec, now, "ops", "fixed"),
        "stale": lambda: complete(rec, instance_id(ORDER, rec.attempt + 7), now),
    }
    return calls[kind]()


def _check_invariants(before: OrderStateRecord, after: OrderStateRecord) -> None:
    resubmitted = len(after.resubmissions) + after.resubmissions_dropped > (
        len(before.resubmissions) + before.resubmissions_dropped
    )
    assert after.failure_count >= before.failure_count or resubmitted  # an operator's resubmit is a fresh budget
    assert after.attempt >= before.attempt
    assert after.updated_at >= before.updated_at
    assert after.failure_count < THRESHOLD or after.process_state is ProcessState.ERROR
    if after.process_state is ProcessState.PENDING:
        assert after.locked_by is None and after.complete_by is None
    if after.process_state is ProcessState.PROCESSING:
        assert after.locked_by == instance_id(ORDER, after.attempt) and after.complete_by is not None
    if before.process_state is ProcessState.PROCESSED:
        assert after.process_state is before.process_state  # terminal
    if before.process_state is ProcessState.ERROR and after.process_state is not ProcessState.ERROR:
        assert after.process_state is ProcessState.PENDING and resubmitted  # only a resubmit reopens a failed order
    if after.process_state is ProcessState.PROCESSED:
        assert after.last_error is None  # an old error is history (previousErrors), never the current one
    # History only grows; past its bound the oldest entries are dropped and counted.
    assert after.previous_errors_dropped + len(after.previous_errors) >= before.previous_errors_dropped + len(
        before.previous_errors
    )
    assert len(after.previous_errors) <= MAX_PREVIOUS_ERRORS and len(after.resubmissions) <= MAX_RESUBMISSIONS
    assert all(len(e) <= ERROR_TEXT_MAX for e in (after.last_error or "", *after.previous_errors))
    # Issue 26: a TTL only on a finished order whose status went out (or TTL_NEVER, kept): never on unfinished work.
    if after.ttl is not None:
        assert after.process_state in TERMINAL_STATES and after.notified_at is not None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "claim",
                    "deadline",
                    "ok",
                    "ko",
                    "complete",
                    "fail",
                    "failbig",
                    "recover",
                    "stale",
                    "notify",
                    "resubmit",
                ]
            ),
            st.integers(0, 400),
            st.sampled_from(STEPS),
        ),
        max_size=30,
    )
)
def test_random_sequences_keep_the_invariants(ops: list[tuple[str, int, StepName]]) -> None:
    rec, now = pending(), NOW
    for kind, seconds, step in ops:
        now += timedelta(seconds=seconds)
        try:
            after = _random_op(kind, rec, now, step)
        except (IllegalTransition, Fenced):
            continue
        _check_invariants(rec, after)
        rec = after


# --- defer ("not now": the circuit breaker is open, or admission gave a claim back) ----------------------------


def test_defer_returns_the_order_to_pending_without_a_failure() -> None:
    rec = in_state(ProcessState.PROCESSING).model_copy(update={"failure_count": 1})
    deferred = defer(rec, FIRST, NOW + LEASE, NOW, "reserve-inventory: CircuitOpen: open")
    assert deferred.process_state is ProcessState.PENDING
    assert deferred.failure_count == 1  # unchanged: no attempt was spent on the remote service
    assert deferred.deferrals == rec.deferrals + 1
    assert deferred.locked_by is None and deferred.complete_by is None
    assert deferred.retry_at == NOW + LEASE
    assert deferred.last_error == "reserve-inventory: CircuitOpen: open"
    # the next claim is a new attempt, due at retryAt
    with pytest.raises(NotDue):
        claim(deferred, instance_id(ORDER, deferred.attempt + 1), NOW + LEASE, NOW)
    assert (
        claim(deferred, instance_id(ORDER, deferred.attempt + 1), NOW + 2 * LEASE, NOW + LEASE).attempt
        == deferred.attempt + 1
    )


def test_defer_is_fenced_and_a_repeat_is_a_no_op() -> None:
    rec = in_state(ProcessState.PROCESSING)
    with pytest.raises(Fenced):
        defer(rec, "someone-else:9", NOW + LEASE, NOW, "x")
    once = defer(rec, FIRST, NOW + LEASE, NOW, "x")
    assert defer(once, FIRST, NOW + LEASE, NOW, "x") is once


def test_restart_keeps_the_attempt_and_the_failure_budget_under_a_new_lease() -> None:
    """A claim whose orchestration never started: the same attempt runs again, nothing is spent."""
    rec = in_state(ProcessState.PROCESSING).model_copy(update={"failure_count": 1})
    again = restart(rec, FIRST, NOW + LEASE, NOW)
    assert (again.process_state, again.locked_by, again.attempt) == (ProcessState.PROCESSING, FIRST, rec.attempt)
    assert again.failure_count == 1 and again.restarts == rec.restarts + 1
    assert again.complete_by == NOW + LEASE and again.last_error == rec.last_error


def test_restart_is_fenced_and_waits_for_the_lease_to_expire() -> None:
    rec = in_state(ProcessState.PROCESSING)
    with pytest.raises(Fenced):
        restart(rec, "someone-else:9", NOW + LEASE, NOW)
    renewed = restart(rec, FIRST, NOW + LEASE, NOW)
    with pytest.raises(NotDue):  # a second Supervisor that saw the old CompleteBy restarts nothing
        restart(renewed, FIRST, NOW + 2 * LEASE, NOW)


# --- compensation and cancel -------------------------------------------------------------------------------------
RELEASE = CompensationName.RELEASE_INVENTORY


def sent(*steps: StepName) -> OrderStateRecord:
    """Processing in attempt 1, the given steps sent (running), CompleteBy expired by NOW."""
    rec = claim(pending(), FIRST, NOW - LEASE, NOW - LEASE)
    for step in steps:
        rec = set_step_deadline(rec, FIRST, step, NOW - LEASE, NOW - LEASE)
    return rec


def compensating(*steps: StepName) -> OrderStateRecord:
    return begin_compensation(sent(*steps), FIRST, "charge-payment: Declined", NOW - LEASE, NOW - LEASE)


def test_a_permanent_failure_compensates_every_sent_step_in_reverse_order() -> None:
    rec = sent(StepName.RESERVE_INVENTORY, StepName.CHARGE_PAYMENT)
    rec = record_step(rec, FIRST, StepName.RESERVE_INVENTORY, StepStatus.SUCCEEDED, NOW)
    undo = begin_compensation(rec, FIRST, "charge-payment: Declined", NOW + LEASE, NOW)
    assert undo.process_state is ProcessState.COMPENSATING and undo.locked_by == FIRST
    # a running step may have been applied by the remote: it is compensated too
    assert [(c.name, c.step, c.status) for c in undo.compensations] == [
        (CompensationName.REFUND_PAYMENT, StepName.CHARGE_PAYMENT, StepStatus.PENDING),
        (RELEASE, StepName.RESERVE_INVENTORY, StepStatus.PENDING),
    ]
    assert undo.compensation_cause == "charge-payment: Declined" and undo.complete_by == NOW + LEASE
    assert begin_compensation(undo, FIRST, "charge-payment: Declined", NOW + LEASE, NOW) is undo  # a repeat


def test_a_step_the_remote_refused_is_not_compensated_and_nothing_sent_ends_in_error() -> None:
    rec = record_step(sent(StepName.RESERVE_INVENTORY), FIRST, StepName.RESERVE_INVENTORY, StepStatus.FAILED, NOW)
    ended = begin_compensation(rec, FIRST, "reserve-inventory: InsufficientStock", NOW + LEASE, NOW)
    assert ended.process_state is ProcessState.ERROR and ended.compensations == ()
    assert ended.last_error == "reserve-inventory: InsufficientStock"


def test_compensation_runs_like_steps_then_completes_or_fails() -> None:
    rec = compensating(StepName.RESERVE_INVENTORY)
    running = set_step_deadline(rec, FIRST, RELEASE, NOW + LEASE, NOW)
    assert running.compensation(RELEASE).status is StepStatus.RUNNING and running.complete_by == NOW + LEASE
    with pytest.raises(IllegalTransition):  # no forward step while compensating
        set_step_deadline(rec, FIRST, StepName.CHARGE_PAYMENT, NOW + LEASE, NOW)
    with pytest.raises(IllegalTransition):  # not done yet
        complete(running, FIRST, NOW)
    done = record_step(running, FIRST, RELEASE, StepStatus.SUCCEEDED, NOW, undone=True)
    assert done.compensation(RELEASE).undone is True
    assert complete(done, FIRST, NOW).process_state is ProcessState.COMPENSATED
    failed = fail(record_step(running, FIRST, RELEASE, StepStatus.FAILED, NOW), FIRST, "RefundRefused", NOW)
    assert failed.process_state is ProcessState.COMPENSATION_FAILED
    with pytest.raises(IllegalTransition):  # a compensation is not sent while Processing
        set_step_deadline(sent(), FIRST, RELEASE, NOW + LEASE, NOW)


def test_the_supervisor_compensates_at_the_threshold_and_retries_a_stuck_compensation() -> None:
    rec = sent(StepName.RESERVE_INVENTORY).model_copy(update={"failure_count": THRESHOLD - 1})
    undo = recover(rec, FIRST, NOW, THRESHOLD, BACKOFF)
    assert undo.process_state is ProcessState.COMPENSATING and undo.locked_by is None and undo.retry_at is None
    assert undo.failure_count == THRESHOLD and (undo.compensation_cause or "").startswith("FailureThresholdReached")
    stuck = compensating(StepName.RESERVE_INVENTORY)
    again = recover(stuck, FIRST, NOW, THRESHOLD, BACKOFF)
    assert (again.process_state, again.locked_by, again.compensation_failures) == (ProcessState.COMPENSATING, None, 1)
    assert again.retry_at == NOW + BACKOFF(1)
    reclaimed = claim(again, instance_id(ORDER, 2), NOW + 2 * LEASE, NOW + LEASE)
    assert reclaimed.process_state is ProcessState.COMPENSATING and reclaimed.attempt == 2
    gave_up = recover(stuck.model_copy(update={"compensation_failures": THRESHOLD - 1}), FIRST, NOW, THRESHOLD, BACKOFF)
    assert gave_up.process_state is ProcessState.COMPENSATION_FAILED
    assert (gave_up.last_error or "").startswith("CompensationThresholdReached")


def test_at_the_threshold_with_nothing_sent_the_order_is_error() -> None:
    rec = sent().model_copy(update={"failure_count": THRESHOLD - 1})
    assert recover(rec, FIRST, NOW, THRESHOLD, BACKOFF).process_state is ProcessState.ERROR


def test_cancel_before_a_claim_is_cancelled_with_nothing_to_undo() -> None:
    cancelled = cancel(pending(), NOW, "customer asked")
    assert cancelled.process_state is ProcessState.CANCELLED and cancelled.compensations == ()
    assert cancelled.compensation_cause == "cancelled: customer asked"
    assert cancel(cancelled, NOW + LEASE, "again") is cancelled  # idempotent
    with pytest.raises(IllegalTransition):
        claim(cancelled, instance_id(ORDER, 1), NOW + LEASE, NOW)


def test_cancel_of_a_pending_order_whose_earlier_attempt_sent_steps_compensates_them() -> None:
    retried = recover(sent(StepName.RESERVE_INVENTORY), FIRST, NOW, THRESHOLD, BACKOFF)
    assert retried.process_state is ProcessState.PENDING
    undo = cancel(retried, NOW)
    assert undo.process_state is ProcessState.COMPENSATING and undo.locked_by is None and undo.retry_at is None
    assert [c.name for c in undo.compensations] == [RELEASE]


def test_cancel_while_processing_is_requested_and_honoured_by_the_supervisor_and_defer() -> None:
    rec = sent(StepName.RESERVE_INVENTORY)
    asked = cancel(rec, NOW)
    assert asked.process_state is ProcessState.PROCESSING and asked.cancel_requested_at == NOW
    assert cancel(asked, NOW + LEASE) is asked and request_cancel(asked, NOW + LEASE) is asked
    recovered = recover(asked, FIRST, NOW, THRESHOLD, BACKOFF)
    assert recovered.process_state is ProcessState.COMPENSATING and recovered.failure_count == 0
    deferred = defer(asked, FIRST, NOW + LEASE, NOW, "CircuitOpen")
    assert deferred.process_state is ProcessState.COMPENSATING and deferred.locked_by is None
    nothing_sent = cancel(sent(), NOW)
    assert recover(nothing_sent, FIRST, NOW, THRESHOLD, BACKOFF).process_state is ProcessState.CANCELLED
    # the client's reason travels with the cancel to whichever path honours it
    with_reason = cancel(rec, NOW, "changed my mind")
    assert recover(with_reason, FIRST, NOW, THRESHOLD, BACKOFF).compensation_cause == "cancelled: changed my mind"
    assert (
        begin_compensation(with_reason, FIRST, "cancelled", NOW + LEASE, NOW).compensation_cause
        == "cancelled: changed my mind"
    )


@pytest.mark.parametrize(
    "state", [ProcessState.PROCESSED, ProcessState.ERROR, ProcessState.COMPENSATED, ProcessState.COMPENSATION_FAILED]
)
def test_cancel_after_the_end_is_refused_and_changes_nothing(state: ProcessState) -> None:
    rec = {
        ProcessState.PROCESSED: lambda: complete(sent(), FIRST, NOW),
        ProcessState.ERROR: lambda: fail(sent(), FIRST, "boom", NOW),
        ProcessState.COMPENSATED: lambda: complete(
            record_step(
                set_step_deadline(compensating(StepName.RESERVE_INVENTORY), FIRST, RELEASE, NOW + LEASE, NOW),
                FIRST,
                RELEASE,
                StepStatus.SUCCEEDED,
                NOW,
            ),
            FIRST,
            NOW,
        ),
        ProcessState.COMPENSATION_FAILED: lambda: fail(compensating(StepName.RESERVE_INVENTORY), FIRST, "x", NOW),
    }[state]()
    assert rec.process_state is state
    with pytest.raises(CancelRefused, match="already processed" if state is ProcessState.PROCESSED else state.value):
        cancel(rec, NOW)


@pytest.mark.parametrize("state", [s for s in ProcessState if s is not ProcessState.PROCESSING])
def test_begin_compensation_and_request_cancel_only_from_processing(state: ProcessState) -> None:
    rec = compensating(StepName.RESERVE_INVENTORY).model_copy(update={"process_state": state})
    with pytest.raises(IllegalTransition):
        request_cancel(rec, NOW)
    if state is not ProcessState.COMPENSATING:
        with pytest.raises(IllegalTransition):
            begin_compensation(rec, FIRST, "another cause", NOW + LEASE, NOW)


def test_a_locked_compensation_is_not_claimed() -> None:
    with pytest.raises(IllegalTransition, match="locked by"):
        claim(compensating(StepName.RESERVE_INVENTORY), instance_id(ORDER, 2), NOW + LEASE, NOW)


def test_restart_and_defer_keep_a_compensation_compensating() -> None:
    rec = compensating(StepName.RESERVE_INVENTORY)
    assert restart(rec, FIRST, NOW + LEASE, NOW).process_state is ProcessState.COMPENSATING
    deferred = defer(rec, FIRST, NOW + LEASE, NOW, "CircuitOpen")
    assert (deferred.process_state, deferred.locked_by, deferred.retry_at) == (
        ProcessState.COMPENSATING,
        None,
        NOW + LEASE,
    )


@pytest.mark.parametrize("state", list(ProcessState))
@pytest.mark.parametrize("event", list(Event))
def test_every_pair_outside_the_table_is_refused(state: ProcessState, event: Event) -> None:
    """The table is the whole truth for every state and event, the compensation and cancel rows included: a pair
    it lacks is refused with the move named (the generic table test above drives the forward rows through their
    functions; the compensation and cancel functions have their own tests)."""
    if (state, event) in TRANSITIONS:
        assert next_state(state, event) is TRANSITIONS[(state, event)]
    else:
        with pytest.raises(IllegalTransition, match=f"{event.value} is not allowed in state {state.value}"):
            next_state(state, event)


@pytest.mark.parametrize("state", [ProcessState.COMPENSATED, ProcessState.COMPENSATION_FAILED, ProcessState.CANCELLED])
def test_the_new_terminal_states_refuse_every_scheduler_and_supervisor_move(state: ProcessState) -> None:
    """Through the functions, not only the table: nothing moves an order out of its end."""
    rec = compensating(StepName.RESERVE_INVENTORY).model_copy(update={"process_state": state})
    for move in (
        lambda r: claim(r.model_copy(update={"locked_by": None}), instance_id(ORDER, 2), NOW + LEASE, NOW),
        lambda r: set_step_deadline(r, FIRST, RELEASE, NOW + LEASE, NOW),
        lambda r: record_step(r, FIRST, RELEASE, StepStatus.SUCCEEDED, NOW),
        lambda r: recover(r, FIRST, NOW, THRESHOLD, BACKOFF),
        lambda r: defer(r, FIRST, NOW + LEASE, NOW, "x"),
        lambda r: restart(r, FIRST, NOW + LEASE, NOW),
        lambda r: begin_compensation(r, FIRST, "another", NOW + LEASE, NOW),
    ):
        with pytest.raises(IllegalTransition):
            move(rec)


def test_a_version_1_record_reads_as_version_2_and_completes_under_the_current_code() -> None:
    """A state record written before schemaVersion 2 (no compensation log, cancel or workflow version; the fields of
    commit 230c614) is read with the defaults, runs its order to the end, and is written back as version 2."""
    v1 = {
        "id": ORDER,
        "orderId": ORDER,
        "processState": "Pending",
        "lockedBy": None,
        "completeBy": None,
        "failureCount": 0,
        "attempt": 0,
        "replyTo": "app-status",
        "lastError": None,
        "previousErrors": [],
        "retryAt": None,
        "deferrals": 0,
        "restarts": 0,
        "orderHash": "h" * 64,
        "schemaVersion": 1,
        "createdAt": "2024-05-01T11:00:00.000000Z",
        "updatedAt": "2024-05-01T11:00:00.000000Z",
        "notifiedAt": None,
        "steps": [
            {"name": s.value, "status": "pending", "attempt": 0, "startedAt": None, "completedAt": None} for s in STEPS
        ],
    }
    rec = OrderStateRecord.from_doc(v1)
    assert rec.schema_version == 2 and rec.compensations == () and rec.cancel_requested_at is None
    rec = claim(rec, FIRST, NOW + LEASE, NOW)
    for step in STEPS:
        rec = record_step(
            set_step_deadline(rec, FIRST, step, NOW + LEASE, NOW, "2.0"), FIRST, step, StepStatus.SUCCEEDED, NOW
        )
    done = complete(rec, FIRST, NOW)
    assert done.process_state is ProcessState.PROCESSED and done.workflow_version == "2.0"
    assert done.to_doc()["schemaVersion"] == 2
