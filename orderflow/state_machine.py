"""The order state machine: ProcessState transitions of a state record as pure functions.

Every function takes a record and returns a new one (records are frozen); forbidden transitions raise
`IllegalTransition`, and an update by a Scheduler that no longer holds the lock raises `Fenced`.
The allowed moves are data (`TRANSITIONS`, `STEP_TRANSITIONS`): a later issue adds Compensating /
Compensated / Cancelled as new rows, not new branches.

Repeating the transition that produced the current state, by the same instance, is a no-op that returns
the record unchanged: activities run at least once, so `complete`, `fail` and `record_step` are idempotent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from enum import StrEnum

from orderflow.clock import ensure_utc
from orderflow.messages import MAX_ATTEMPT, StepName
from orderflow.records import OrderStateRecord, ProcessState, StepRecord, StepStatus, instance_id

__all__ = [
    "Backoff",
    "Event",
    "Fenced",
    "IllegalTransition",
    "NotDue",
    "ProcessState",
    "STEP_TRANSITIONS",
    "TRANSITIONS",
    "claim",
    "complete",
    "defer",
    "restart",
    "exponential_backoff",
    "fail",
    "next_state",
    "record_step",
    "recover",
    "set_step_deadline",
]


class IllegalTransition(Exception):
    """The record's state does not allow this move (permanent for this record version)."""


class NotDue(IllegalTransition):
    """The move is allowed later: a claim before retryAt, a recovery before CompleteBy expired."""


class Fenced(Exception):
    """The caller is not (or no longer) the instance named in LockedBy: its update must not apply."""

    def __init__(self, order_id: str, expected: str, locked_by: str | None) -> None:
        super().__init__(order_id, expected, locked_by)
        self.order_id = order_id
        self.expected = expected
        self.locked_by = locked_by

    def __str__(self) -> str:
        return f"order {self.order_id}: update by {self.expected!r} fenced, LockedBy is {self.locked_by!r}"


class Event(StrEnum):
    CLAIM = "claim"
    SET_STEP_DEADLINE = "set_step_deadline"
    RECORD_STEP = "record_step"
    COMPLETE = "complete"
    FAIL = "fail"
    RECOVER_RETRY = "recover_retry"
    RECOVER_GIVE_UP = "recover_give_up"
    DEFER = "defer"
    RESTART = "restart"


TRANSITIONS: Mapping[tuple[ProcessState, Event], ProcessState] = {
    (ProcessState.PENDING, Event.CLAIM): ProcessState.PROCESSING,
    (ProcessState.PROCESSING, Event.SET_STEP_DEADLINE): ProcessState.PROCESSING,
    (ProcessState.PROCESSING, Event.RECORD_STEP): ProcessState.PROCESSING,
    (ProcessState.PROCESSING, Event.COMPLETE): ProcessState.PROCESSED,
    (ProcessState.PROCESSING, Event.FAIL): ProcessState.ERROR,
    (ProcessState.PROCESSING, Event.RECOVER_RETRY): ProcessState.PENDING,
    (ProcessState.PROCESSING, Event.RECOVER_GIVE_UP): ProcessState.ERROR,
    (ProcessState.PROCESSING, Event.DEFER): ProcessState.PENDING,
    (ProcessState.PROCESSING, Event.RESTART): ProcessState.PROCESSING,
}

# Step status moves within one attempt. A step last touched by an earlier attempt may restart (→ running).
STEP_TRANSITIONS: Mapping[StepStatus, frozenset[StepStatus]] = {
    StepStatus.PENDING: frozenset({StepStatus.RUNNING}),
    StepStatus.RUNNING: frozenset({StepStatus.RUNNING, StepStatus.SUCCEEDED, StepStatus.FAILED}),
    StepStatus.FAILED: frozenset({StepStatus.RUNNING}),
    StepStatus.SUCCEEDED: frozenset(),
}

Backoff = Callable[[int], timedelta]


def next_state(state: ProcessState, event: Event) -> ProcessState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"{event.value} is not allowed in state {state.value}") from None


def exponential_backoff(base_seconds: float, max_seconds: float) -> Backoff:
    """Delay before retry number `failure_count` (1-based): base * 2**(n-1), capped at max_seconds."""
    if base_seconds < 0 or max_seconds < 0:
        raise ValueError("backoff seconds must be >= 0")

    def delay(failure_count: int) -> timedelta:
        if failure_count < 1:
            raise ValueError(f"failure_count must be >= 1, got {failure_count}")
        exponent = min(failure_count - 1, 62)  # 2**62 seconds is past any cap; avoids huge ints
        return timedelta(seconds=min(base_seconds * (2**exponent), max_seconds))

    return delay


def _fence(rec: OrderStateRecord, instance: str) -> None:
    if rec.locked_by != instance:
        raise Fenced(rec.order_id, instance, rec.locked_by)


def _error_changes(rec: OrderStateRecord, error: str | None) -> dict[str, object]:
    """`last_error` becomes `error`; the error it replaces is kept, oldest first, in `previous_errors`."""
    replaced = rec.last_error
    history = rec.previous_errors if replaced is None or replaced == error else (*rec.previous_errors, replaced)
    return {"last_error": error, "previous_errors": history}


def _move(rec: OrderStateRecord, event: Event, now: datetime, **changes: object) -> OrderStateRecord:
    target = next_state(rec.process_state, event)
    return rec.model_copy(update={"process_state": target, "updated_at": ensure_utc(now), **changes})


def claim(rec: OrderStateRecord, instance: str, lease_until: datetime, now: datetime) -> OrderStateRecord:
    """Starter: Pending, unlocked, due → Processing, LockedBy `<orderId>:<attempt+1>`, CompleteBy = lease."""
    next_state(rec.process_state, Event.CLAIM)
    if rec.locked_by is not None:
        raise IllegalTransition(f"order {rec.order_id} is Pending but locked by {rec.locked_by!r}")
    if rec.retry_at is not None and rec.retry_at > ensure_utc(now):
        raise NotDue(f"order {rec.order_id} may be claimed again at {rec.retry_at.isoformat()}")
    attempt = rec.attempt + 1
    if attempt > MAX_ATTEMPT or instance != instance_id(rec.order_id, attempt):
        raise ValueError(
            f"claim of attempt {attempt} must use instance id {rec.order_id}:{attempt}, got {instance!r}"
        )
    return _move(
        rec,
        Event.CLAIM,
        now,
        locked_by=instance,
        attempt=attempt,
        complete_by=ensure_utc(lease_until),
        retry_at=None,
    )


def _with_step(
    rec: OrderStateRecord, step: StepName, status: StepStatus, now: datetime
) -> tuple[StepRecord, ...]:
    current = rec.step(step)
    same_attempt = current.attempt == rec.attempt
    if same_attempt and status not in STEP_TRANSITIONS[current.status]:
        raise IllegalTransition(f"step {step.value}: {current.status.value} → {status.value} is not allowed")
    if not same_attempt and status is not StepStatus.RUNNING:
        raise IllegalTransition(f"step {step.value} must start (running) in attempt {rec.attempt} first")
    at = ensure_utc(now)
    if status is StepStatus.RUNNING:
        updated = current.model_copy(
            update={"status": status, "attempt": rec.attempt, "started_at": at, "completed_at": None}
        )
    else:
        updated = current.model_copy(update={"status": status, "completed_at": at})
    return tuple(updated if s.name == step else s for s in rec.steps)


def set_step_deadline(
    rec: OrderStateRecord, instance: str, step: StepName, complete_by: datetime, now: datetime
) -> OrderStateRecord:
    """Scheduler (fenced): CompleteBy = the step's deadline; the step is running in this attempt."""
    _fence(rec, instance)
    next_state(rec.process_state, Event.SET_STEP_DEADLINE)
    current = rec.step(step)
    if (
        current.status is StepStatus.RUNNING
        and current.attempt == rec.attempt
        and rec.complete_by == complete_by
    ):
        return rec
    return _move(
        rec,
        Event.SET_STEP_DEADLINE,
        now,
        complete_by=ensure_utc(complete_by),
        steps=_with_step(rec, step, StepStatus.RUNNING, now),
    )


def record_step(
    rec: OrderStateRecord,
    instance: str,
    step: StepName,
    status: StepStatus,
    now: datetime,
    error: str | None = None,
) -> OrderStateRecord:
    """Scheduler (fenced): a step's outcome in this attempt; repeating the same outcome is a no-op."""
    _fence(rec, instance)
    next_state(rec.process_state, Event.RECORD_STEP)
    current = rec.step(step)
    if current.status is status and current.attempt == rec.attempt and status is not StepStatus.RUNNING:
        return rec
    changes: dict[str, object] = {"steps": _with_step(rec, step, status, now)}
    if error is not None:
        changes.update(_error_changes(rec, error))
    return _move(rec, Event.RECORD_STEP, now, **changes)


def complete(rec: OrderStateRecord, instance: str, now: datetime) -> OrderStateRecord:
    """Scheduler (fenced): Processing → Processed. LockedBy stays as the record of who finished it.

    An error left by an earlier attempt (or a failed step that later succeeded) is history, not the outcome: it
    moves to `previous_errors` and `last_error` is cleared."""
    _fence(rec, instance)
    if rec.process_state is ProcessState.PROCESSED:
        return rec
    return _move(rec, Event.COMPLETE, now, complete_by=None, **_error_changes(rec, None))


def fail(rec: OrderStateRecord, instance: str, error: str, now: datetime) -> OrderStateRecord:
    """Scheduler (fenced): Processing → Error with the permanent error."""
    _fence(rec, instance)
    if rec.process_state is ProcessState.ERROR and rec.last_error == error:
        return rec
    return _move(rec, Event.FAIL, now, complete_by=None, **_error_changes(rec, error))


def recover(
    rec: OrderStateRecord, expected_locked_by: str, now: datetime, threshold: int, backoff: Backoff
) -> OrderStateRecord:
    """Supervisor (fenced on the expired LockedBy): FailureCount+1, then Pending after a backoff or Error.

    Raises NotDue while CompleteBy has not expired (a Scheduler extended it since the Supervisor's query).
    """
    _fence(rec, expected_locked_by)
    at = ensure_utc(now)
    next_state(rec.process_state, Event.RECOVER_RETRY)
    if rec.complete_by is not None and rec.complete_by > at:
        raise NotDue(f"order {rec.order_id}: CompleteBy {rec.complete_by.isoformat()} has not expired")
    failures = rec.failure_count + 1
    expired = f"attempt {rec.attempt} ({expected_locked_by}) expired at CompleteBy " + (
        rec.complete_by.isoformat() if rec.complete_by else "unset"
    )
    if failures >= threshold:
        return _move(
            rec,
            Event.RECOVER_GIVE_UP,
            at,
            failure_count=failures,
            locked_by=None,
            complete_by=None,
            retry_at=None,
            **_error_changes(rec, f"FailureThresholdReached: {expired}"),
        )
    return _move(
        rec,
        Event.RECOVER_RETRY,
        at,
        failure_count=failures,
        locked_by=None,
        complete_by=None,
        retry_at=at + backoff(failures),
        **_error_changes(rec, expired),
    )


def restart(rec: OrderStateRecord, expected_locked_by: str, lease_until: datetime, now: datetime) -> OrderStateRecord:
    """Supervisor (fenced on the expired LockedBy): the attempt's orchestration was never started — a crash fell
    between the Starter's claim and its `start_new` — so the same attempt starts again under a new claim lease.
    FailureCount and the attempt are unchanged (a crash delays a healthy order, it never spends its failure budget);
    `restarts` counts these. Raises NotDue while CompleteBy has not expired."""
    _fence(rec, expected_locked_by)
    at = ensure_utc(now)
    next_state(rec.process_state, Event.RESTART)
    if rec.complete_by is not None and rec.complete_by > at:
        raise NotDue(f"order {rec.order_id}: CompleteBy {rec.complete_by.isoformat()} has not expired")
    return _move(rec, Event.RESTART, at, complete_by=ensure_utc(lease_until), restarts=rec.restarts + 1)


def defer(rec: OrderStateRecord, instance: str, retry_at: datetime, now: datetime, reason: str) -> OrderStateRecord:
    """Fenced on LockedBy: Processing → Pending, "not now" — the circuit breaker of the remote service is open, or
    admission control gave a claim back. FailureCount is unchanged (no attempt was spent on the remote service);
    `deferrals` counts these. The next claim starts a new attempt. Repeating it is a no-op (the lock is gone)."""
    if rec.process_state is ProcessState.PENDING and rec.locked_by is None and rec.retry_at == ensure_utc(retry_at) \
            and rec.last_error == reason:
        return rec
    _fence(rec, instance)
    return _move(rec, Event.DEFER, now, locked_by=None, complete_by=None, retry_at=ensure_utc(retry_at),
                 deferrals=rec.deferrals + 1, **_error_changes(rec, reason))


TERMINAL_STATES = frozenset({ProcessState.PROCESSED, ProcessState.ERROR})


def mark_notified(rec: OrderStateRecord, now: datetime) -> OrderStateRecord:
    """A terminal record's status (and alert) has been sent; repeating it is a no-op. Not a state change."""
    if rec.process_state not in TERMINAL_STATES:
        raise IllegalTransition(f"order {rec.order_id} is {rec.process_state.value}: nothing to notify yet")
    if rec.notified_at is not None:
        return rec
    return rec.model_copy(update={"notified_at": ensure_utc(now), "updated_at": ensure_utc(now)})
