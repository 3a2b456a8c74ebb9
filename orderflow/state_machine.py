"""The order state machine: ProcessState transitions of a state record as pure functions.

Every function takes a record and returns a new one (records are frozen); forbidden transitions raise
`IllegalTransition`, and an update by a Scheduler that no longer holds the lock raises `Fenced`.
The allowed moves are data (`TRANSITIONS`, `STEP_TRANSITIONS`); compensation and cancel are rows like any other.

Repeating the transition that produced the current state, by the same instance, is a no-op that returns
the record unchanged: activities run at least once, so `complete`, `fail` and `record_step` are idempotent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum

from orderflow.backoff import Backoff, exponential_backoff
from orderflow.clock import ensure_utc
from orderflow.messages import COMPENSATION_OF, MAX_ATTEMPT, CompensationName, StepName
from orderflow.records import (
    CLAIMABLE_STATES,
    MAX_PREVIOUS_ERRORS,
    MAX_RESUBMISSIONS,
    TERMINAL_STATES,
    TTL_NEVER,
    CompensationRecord,
    IllegalTransition,
    OrderStateRecord,
    ProcessState,
    Resubmission,
    StepRecord,
    StepStatus,
    error_text,
    instance_id,
    newest,
)

__all__ = [
    "Backoff",
    "Event",
    "Fenced",
    "IllegalTransition",
    "NotDue",
    "ProcessState",
    "STEP_TRANSITIONS",
    "TERMINAL_STATES",
    "Wrote",
    "TRANSITIONS",
    "claim",
    "complete",
    "begin_compensation",
    "cancel",
    "cancel_pending",
    "CancelRefused",
    "compensation_log",
    "defer",
    "request_cancel",
    "restart",
    "resubmit",
    "ResubmitRefused",
    "exponential_backoff",
    "fail",
    "fence",
    "next_state",
    "record_step",
    "recover",
    "set_step_deadline",
]


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
    COMPENSATE = "compensate"
    CANCEL = "cancel"
    REQUEST_CANCEL = "request_cancel"
    RESUBMIT = "resubmit"


P, R, D, E = ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.PROCESSED, ProcessState.ERROR
C, CD, CF, X = (
    ProcessState.COMPENSATING,
    ProcessState.COMPENSATED,
    ProcessState.COMPENSATION_FAILED,
    ProcessState.CANCELLED,
)
TRANSITIONS: Mapping[tuple[ProcessState, Event], ProcessState] = {
    (P, Event.CLAIM): R,
    (R, Event.SET_STEP_DEADLINE): R,
    (R, Event.RECORD_STEP): R,
    (R, Event.COMPLETE): D,
    (R, Event.FAIL): E,
    (R, Event.RECOVER_RETRY): P,
    (R, Event.RECOVER_GIVE_UP): E,
    (R, Event.DEFER): P,
    (R, Event.RESTART): R,
    # Compensation: the Scheduler (a permanent failure, a cancel), the Supervisor (FailureThreshold with steps sent,
    # or an expired attempt of a cancelled order) or a cancel of a Pending order whose earlier attempt sent steps.
    (P, Event.COMPENSATE): C,
    (R, Event.COMPENSATE): C,
    (C, Event.CLAIM): C,
    (C, Event.SET_STEP_DEADLINE): C,
    (C, Event.RECORD_STEP): C,
    (C, Event.COMPLETE): CD,
    (C, Event.FAIL): CF,
    (C, Event.RECOVER_RETRY): C,
    (C, Event.RECOVER_GIVE_UP): CF,
    (C, Event.DEFER): C,
    (C, Event.RESTART): C,
    # Cancel: before any step was sent there is nothing to undo.
    (P, Event.CANCEL): X,
    (R, Event.CANCEL): X,
    (R, Event.REQUEST_CANCEL): R,
    # An operator's resubmit (orderflow/operations.py), with a fresh failure budget: a failed order runs again; a
    # failed compensation is tried again.
    (E, Event.RESUBMIT): P,
    (CF, Event.RESUBMIT): C,
}
del P, R, D, E, C, CD, CF, X

# Step status moves within one attempt. A step last touched by an earlier attempt may restart (→ running).
STEP_TRANSITIONS: Mapping[StepStatus, frozenset[StepStatus]] = {
    StepStatus.PENDING: frozenset({StepStatus.RUNNING}),
    StepStatus.RUNNING: frozenset({StepStatus.RUNNING, StepStatus.SUCCEEDED, StepStatus.FAILED}),
    StepStatus.FAILED: frozenset({StepStatus.RUNNING}),
    StepStatus.SUCCEEDED: frozenset(),
}


def next_state(state: ProcessState, event: Event) -> ProcessState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"{event.value} is not allowed in state {state.value}") from None


def fence(rec: OrderStateRecord, instance: str) -> None:
    if rec.locked_by != instance:
        raise Fenced(rec.order_id, instance, rec.locked_by)


def _error_changes(rec: OrderStateRecord, error: str | None) -> dict[str, object]:
    """`last_error` becomes `error` (bounded: records.error_text); the error it replaces is kept, oldest first, in
    `previous_errors`, which keeps the newest MAX_PREVIOUS_ERRORS and counts the ones it drops."""
    error = None if error is None else error_text(error)
    replaced = rec.last_error
    history = rec.previous_errors if replaced is None or replaced == error else (*rec.previous_errors, replaced)
    kept, dropped = newest(history, MAX_PREVIOUS_ERRORS)
    return {
        "last_error": error,
        "previous_errors": kept,
        "previous_errors_dropped": rec.previous_errors_dropped + dropped,
    }


def _move(rec: OrderStateRecord, event: Event, now: datetime, **changes: object) -> OrderStateRecord:
    target = next_state(rec.process_state, event)
    return rec.model_copy(update={"process_state": target, "updated_at": ensure_utc(now), **changes})


def claim(rec: OrderStateRecord, instance: str, lease_until: datetime, now: datetime) -> OrderStateRecord:
    """Starter: Pending (or CompensationInProgress), unlocked, due → Processing (CompensationInProgress), LockedBy
    `<orderId>:<attempt+1>`, CompleteBy = lease."""
    next_state(rec.process_state, Event.CLAIM)
    if rec.locked_by is not None:
        raise IllegalTransition(f"order {rec.order_id} is {rec.process_state.value} but locked by {rec.locked_by!r}")
    if rec.retry_at is not None and rec.retry_at > ensure_utc(now):
        raise NotDue(f"order {rec.order_id} may be claimed again at {rec.retry_at.isoformat()}")
    attempt = rec.attempt + 1
    if attempt > MAX_ATTEMPT or instance != instance_id(rec.order_id, attempt):
        raise ValueError(f"claim of attempt {attempt} must use instance id {rec.order_id}:{attempt}, got {instance!r}")
    return _move(
        rec,
        Event.CLAIM,
        now,
        locked_by=instance,
        attempt=attempt,
        complete_by=ensure_utc(lease_until),
        retry_at=None,
    )


def _check_status_move(what: str, current: StepStatus, same_attempt: bool, status: StepStatus) -> None:
    if same_attempt and status not in STEP_TRANSITIONS[current]:
        raise IllegalTransition(f"{what}: {current.value} → {status.value} is not allowed")
    if not same_attempt and status is not StepStatus.RUNNING:
        raise IllegalTransition(f"{what} must start (running) in this attempt first")


def _status_changes(status: StepStatus, attempt: int, at: datetime) -> dict[str, object]:
    if status is StepStatus.RUNNING:
        return {"status": status, "attempt": attempt, "started_at": at, "completed_at": None}
    return {"status": status, "completed_at": at}


def _with_step(rec: OrderStateRecord, step: StepName, status: StepStatus, now: datetime) -> tuple[StepRecord, ...]:
    current = rec.step(step)
    _check_status_move(f"step {step.value}", current.status, current.attempt == rec.attempt, status)
    updated = current.model_copy(update=_status_changes(status, rec.attempt, ensure_utc(now)))
    return tuple(updated if s.name == step else s for s in rec.steps)


def _with_compensation(
    rec: OrderStateRecord, name: CompensationName, status: StepStatus, now: datetime, undone: bool | None = None
) -> tuple[CompensationRecord, ...]:
    current = rec.compensation(name)
    if current.status is StepStatus.SUCCEEDED:
        raise IllegalTransition(f"compensation {name.value} already succeeded")
    _check_status_move(f"compensation {name.value}", current.status, current.attempt == rec.attempt, status)
    changes = _status_changes(status, rec.attempt, ensure_utc(now))
    if undone is not None:
        changes["undone"] = undone
    updated = current.model_copy(update=changes)
    return tuple(updated if c.name == name else c for c in rec.compensations)


def _current_status(rec: OrderStateRecord, action: StepName | CompensationName) -> tuple[StepStatus, int]:
    """The status and attempt of a step (Processing) or a compensation (CompensationInProgress) of this record;
    IllegalTransition when the action does not belong to the record's phase."""
    if isinstance(action, CompensationName):
        if rec.process_state is not ProcessState.COMPENSATING:
            raise IllegalTransition(f"compensation {action.value} outside CompensationInProgress")
        found = rec.compensation(action)
        return found.status, found.attempt
    if rec.process_state is ProcessState.COMPENSATING:
        raise IllegalTransition(f"step {action.value} while the order is compensated")
    current = rec.step(action)
    return current.status, current.attempt


def set_step_deadline(
    rec: OrderStateRecord,
    instance: str,
    step: StepName | CompensationName,
    complete_by: datetime,
    now: datetime,
    workflow_version: str | None = None,
) -> OrderStateRecord:
    """Scheduler (fenced): CompleteBy = the step's (or compensation's) deadline; it is running in this attempt. The
    Scheduler's workflow version, when given, is recorded with it (no write of its own)."""
    fence(rec, instance)
    next_state(rec.process_state, Event.SET_STEP_DEADLINE)
    status, attempt = _current_status(rec, step)
    version = workflow_version or rec.workflow_version
    if (
        status is StepStatus.RUNNING
        and attempt == rec.attempt
        and rec.complete_by == complete_by
        and version == rec.workflow_version
    ):
        return rec
    changes: dict[str, object] = {"complete_by": ensure_utc(complete_by), "workflow_version": version}
    if isinstance(step, CompensationName):
        changes["compensations"] = _with_compensation(rec, step, StepStatus.RUNNING, now)
    else:
        changes["steps"] = _with_step(rec, step, StepStatus.RUNNING, now)
    return _move(rec, Event.SET_STEP_DEADLINE, now, **changes)


def record_step(
    rec: OrderStateRecord,
    instance: str,
    step: StepName | CompensationName,
    status: StepStatus,
    now: datetime,
    error: str | None = None,
    undone: bool | None = None,
) -> OrderStateRecord:
    """Scheduler (fenced): a step's (or compensation's, with the remote's `undone`) outcome in this attempt;
    repeating the same outcome is a no-op."""
    fence(rec, instance)
    next_state(rec.process_state, Event.RECORD_STEP)
    current, attempt = _current_status(rec, step)
    if current is status and attempt == rec.attempt and status is not StepStatus.RUNNING:
        return rec
    changes: dict[str, object] = {}
    if isinstance(step, CompensationName):
        changes["compensations"] = _with_compensation(rec, step, status, now, undone)
    else:
        changes["steps"] = _with_step(rec, step, status, now)
    if error is not None:
        changes.update(_error_changes(rec, error))
    return _move(rec, Event.RECORD_STEP, now, **changes)


def complete(rec: OrderStateRecord, instance: str, now: datetime) -> OrderStateRecord:
    """Scheduler (fenced): Processing → Processed, or CompensationInProgress → Compensated once every compensation
    succeeded. LockedBy stays as the record of who finished it.

    An error left by an earlier attempt (or a failed step that later succeeded) is history, not the outcome: it
    moves to `previous_errors` and `last_error` is cleared."""
    fence(rec, instance)
    if rec.process_state in (ProcessState.PROCESSED, ProcessState.COMPENSATED):
        return rec
    if rec.process_state is ProcessState.COMPENSATING:
        left = [c.name.value for c in rec.compensations if c.status is not StepStatus.SUCCEEDED]
        if left:
            raise IllegalTransition(f"order {rec.order_id}: compensations not done: {', '.join(left)}")
        return _move(rec, Event.COMPLETE, now, complete_by=None)
    return _move(rec, Event.COMPLETE, now, complete_by=None, **_error_changes(rec, None))


def fail(rec: OrderStateRecord, instance: str, error: str, now: datetime) -> OrderStateRecord:
    """Scheduler (fenced): Processing → Error with the permanent error; CompensationInProgress → CompensationFailed
    (a compensation failed permanently)."""
    fence(rec, instance)
    error = error_text(error)
    if rec.process_state in (ProcessState.ERROR, ProcessState.COMPENSATION_FAILED) and rec.last_error == error:
        return rec
    return _move(rec, Event.FAIL, now, complete_by=None, **_error_changes(rec, error))


CANCELLED_PREFIX = "cancelled"


def compensation_log(rec: OrderStateRecord) -> tuple[CompensationRecord, ...]:
    """The compensations of every step that was sent, in reverse order of the steps."""
    return tuple(CompensationRecord(name=COMPENSATION_OF[s], step=s) for s in reversed(rec.sent_steps()))


def _undo(
    rec: OrderStateRecord, at: datetime, cause: str, changes: dict[str, object], give_up: Event = Event.FAIL
) -> OrderStateRecord:
    """Into compensation (the steps sent are undone, newest first) or, with nothing sent, to the end: Cancelled for a
    cancel, Error (by `give_up`) for a failure. A failure's caller passes its error changes."""
    log = compensation_log(rec)
    if log:
        return _move(rec, Event.COMPENSATE, at, compensation_cause=cause, compensations=log, **changes)
    final = {**changes, "complete_by": None, "compensation_cause": cause}  # the cause, for a repeat to recognise
    return _move(rec, Event.CANCEL if cause.startswith(CANCELLED_PREFIX) else give_up, at, **final)


def begin_compensation(
    rec: OrderStateRecord, instance: str, cause: str, complete_by: datetime, now: datetime
) -> OrderStateRecord:
    """Scheduler (fenced): a step failed permanently, or the order was cancelled, while this attempt runs:
    Processing → CompensationInProgress with the log of every step sent (this instance keeps the lock and runs
    them), or straight to Cancelled / Error when nothing was sent. A repeat is a no-op."""
    fence(rec, instance)
    if cause == CANCELLED_PREFIX:
        cause = _cancel_cause(rec.cancel_reason)  # the client's reason, recorded with the cancel
    cause = error_text(cause)
    if rec.compensation_cause == cause and rec.process_state is not ProcessState.PROCESSING:
        return rec
    if rec.process_state is not ProcessState.PROCESSING:
        raise IllegalTransition(
            f"order {rec.order_id} is {rec.process_state.value}: only a running attempt begins a compensation"
        )
    errors = {} if cause.startswith(CANCELLED_PREFIX) else _error_changes(rec, cause)
    return _undo(rec, ensure_utc(now), cause, {"complete_by": ensure_utc(complete_by), **errors})


def _cancel_cause(reason: str | None) -> str:
    return f"{CANCELLED_PREFIX}: {reason}" if reason else CANCELLED_PREFIX


class CancelRefused(IllegalTransition):
    """A cancel that comes too late (the order is Processed) or after a failure: the record is unchanged."""


def cancel(rec: OrderStateRecord, now: datetime, reason: str | None = None) -> OrderStateRecord:
    """A client's CancelOrder (etag-guarded, no fence: the submission trigger writes it).

    Pending → Cancelled (no remote call) or, when an earlier attempt sent steps, → CompensationInProgress, unlocked
    and due now (the Starter claims the compensation). Processing → the same state with cancelRequestedAt: the
    running attempt is told by an event and honours it at its next decision point, and the Supervisor honours it
    when that attempt expires. Idempotent: a cancelled, cancelling or compensating-for-a-cancel order is returned
    unchanged. Processed, Error and compensations of a failure refuse it (CancelRefused)."""
    at = ensure_utc(now)
    if rec.cancel_requested_at is not None or (rec.compensation_cause or "").startswith(CANCELLED_PREFIX):
        return rec
    if rec.process_state is ProcessState.PENDING:
        return _undo(
            rec, at, _cancel_cause(reason), {"retry_at": None, "cancel_requested_at": at, "cancel_reason": reason}
        )
    if rec.process_state is ProcessState.PROCESSING:
        return request_cancel(rec, at, reason)
    raise CancelRefused(
        f"order {rec.order_id} is {rec.process_state.value}: "
        + ("already processed" if rec.process_state is ProcessState.PROCESSED else "not cancellable")
    )


def cancel_pending(rec: OrderStateRecord, instance: str) -> bool:
    """A cancel recorded for the order while `instance` runs it (Processing, its lock): the running attempt honours it
    at its next decision point."""
    return (
        rec.cancel_requested_at is not None
        and rec.locked_by == instance
        and rec.process_state is ProcessState.PROCESSING
    )


def request_cancel(rec: OrderStateRecord, now: datetime, reason: str | None = None) -> OrderStateRecord:
    """Processing → Processing with cancelRequestedAt and the client's reason (the running attempt honours it); a
    repeat is a no-op."""
    next_state(rec.process_state, Event.REQUEST_CANCEL)
    if rec.cancel_requested_at is not None:
        return rec
    return _move(rec, Event.REQUEST_CANCEL, ensure_utc(now), cancel_requested_at=ensure_utc(now), cancel_reason=reason)


def recover(
    rec: OrderStateRecord, expected_locked_by: str, now: datetime, threshold: int, backoff: Backoff
) -> OrderStateRecord:
    """Supervisor (fenced on the expired LockedBy).

    Processing: a cancelled order is undone (or Cancelled); otherwise FailureCount+1, then Pending after a backoff,
    or at the threshold compensation of the steps sent (Error when none was sent). CompensationInProgress:
    compensationFailures+1, then unlocked after a backoff (the Starter claims it again), or CompensationFailed.

    Raises NotDue while CompleteBy has not expired (a Scheduler extended it since the Supervisor's query).
    """
    fence(rec, expected_locked_by)
    at = ensure_utc(now)
    next_state(rec.process_state, Event.RECOVER_RETRY)
    if rec.complete_by is not None and rec.complete_by > at:
        raise NotDue(f"order {rec.order_id}: CompleteBy {rec.complete_by.isoformat()} has not expired")
    expired = f"attempt {rec.attempt} ({expected_locked_by}) expired at CompleteBy " + (
        rec.complete_by.isoformat() if rec.complete_by else "unset"
    )
    unlocked: dict[str, object] = {"locked_by": None, "complete_by": None}
    if rec.process_state is ProcessState.COMPENSATING:
        failures = rec.compensation_failures + 1
        if failures >= threshold:
            return _move(
                rec,
                Event.RECOVER_GIVE_UP,
                at,
                compensation_failures=failures,
                retry_at=None,
                **unlocked,
                **_error_changes(rec, f"CompensationThresholdReached: {expired}"),
            )
        return _move(
            rec,
            Event.RECOVER_RETRY,
            at,
            compensation_failures=failures,
            retry_at=at + backoff(failures),
            **unlocked,
            **_error_changes(rec, expired),
        )
    if rec.cancel_requested_at is not None:
        return _undo(rec, at, _cancel_cause(rec.cancel_reason), {"retry_at": None, **unlocked})
    failures = rec.failure_count + 1
    if failures >= threshold:
        cause = f"FailureThresholdReached: {expired}"
        return _undo(
            rec,
            at,
            cause,
            {"failure_count": failures, "retry_at": None, **unlocked, **_error_changes(rec, cause)},
            Event.RECOVER_GIVE_UP,
        )
    return _move(
        rec,
        Event.RECOVER_RETRY,
        at,
        failure_count=failures,
        retry_at=at + backoff(failures),
        **unlocked,
        **_error_changes(rec, expired),
    )


def restart(rec: OrderStateRecord, expected_locked_by: str, lease_until: datetime, now: datetime) -> OrderStateRecord:
    """Supervisor (fenced on the expired LockedBy): the attempt's orchestration was never started — a crash fell
    between the Starter's claim and its `start_new` — so the same attempt starts again under a new claim lease.
    FailureCount and the attempt are unchanged (a crash delays a healthy order, it never spends its failure budget);
    `restarts` counts these. Raises NotDue while CompleteBy has not expired."""
    fence(rec, expected_locked_by)
    at = ensure_utc(now)
    next_state(rec.process_state, Event.RESTART)
    if rec.complete_by is not None and rec.complete_by > at:
        raise NotDue(f"order {rec.order_id}: CompleteBy {rec.complete_by.isoformat()} has not expired")
    return _move(rec, Event.RESTART, at, complete_by=ensure_utc(lease_until), restarts=rec.restarts + 1)


def defer(rec: OrderStateRecord, instance: str, retry_at: datetime, now: datetime, reason: str) -> OrderStateRecord:
    """Fenced on LockedBy: Processing → Pending (CompensationInProgress stays, unlocked), "not now" — the circuit
    breaker of the remote service is open, or admission control gave a claim back. FailureCount is unchanged (no
    attempt was spent on the remote service); `deferrals` counts these. The next claim starts a new attempt. A
    cancelled order is undone instead. Repeating it is a no-op (the lock is gone)."""
    reason = error_text(reason)
    if (
        rec.process_state in CLAIMABLE_STATES
        and rec.locked_by is None
        and rec.retry_at == ensure_utc(retry_at)
        and rec.last_error == reason
    ):
        return rec
    fence(rec, instance)
    at = ensure_utc(now)
    unlocked: dict[str, object] = {"locked_by": None, "complete_by": None, "deferrals": rec.deferrals + 1}
    if rec.process_state is ProcessState.PROCESSING and rec.cancel_requested_at is not None:
        return _undo(rec, at, _cancel_cause(rec.cancel_reason), {"retry_at": None, **unlocked})
    return _move(rec, Event.DEFER, at, retry_at=ensure_utc(retry_at), **unlocked, **_error_changes(rec, reason))


class ResubmitRefused(IllegalTransition):
    """A resubmit of an order that is not Error or CompensationFailed: the record is unchanged."""


def resubmit(rec: OrderStateRecord, now: datetime, by: str, reason: str) -> OrderStateRecord:
    """An operator's resubmit (etag-guarded, no fence: nobody holds a failed order). Error → Pending, or
    CompensationFailed → CompensationInProgress, unlocked and due now, with a fresh failure budget (FailureCount or
    compensationFailures 0), the current error moved to `previous_errors`, and the terminal notification owed again
    (notifiedAt null: the order's next end is reported). The audit entry says who, when, why and what was spent."""
    at = ensure_utc(now)
    if (rec.process_state, Event.RESUBMIT) not in TRANSITIONS:
        raise ResubmitRefused(
            f"order {rec.order_id} is {rec.process_state.value}: only an order in "
            f"{ProcessState.ERROR.value} or {ProcessState.COMPENSATION_FAILED.value} can be "
            "resubmitted"
        )
    compensating = rec.process_state is ProcessState.COMPENSATION_FAILED
    spent = rec.compensation_failures if compensating else rec.failure_count
    audit = Resubmission(at=at, by=by, reason=reason, from_state=rec.process_state, failure_count=spent)
    budget = {"compensation_failures": 0} if compensating else {"failure_count": 0}
    return _move(
        rec,
        Event.RESUBMIT,
        at,
        locked_by=None,
        complete_by=None,
        retry_at=None,
        notified_at=None,
        **_audited(rec, audit),
        **budget,
        **_error_changes(rec, None),
    )


def _audited(rec: OrderStateRecord, audit: Resubmission) -> dict[str, object]:
    """The resubmission audit with `audit` appended: the newest MAX_RESUBMISSIONS, the older ones counted."""
    entries, dropped = newest((*rec.resubmissions, audit), MAX_RESUBMISSIONS)
    # Unfinished again: a finished order's TTL goes (a kept order stays kept).
    ttl = rec.ttl if rec.ttl == TTL_NEVER else None
    return {"resubmissions": entries, "resubmissions_dropped": rec.resubmissions_dropped + dropped, "ttl": ttl}


def mark_notified(rec: OrderStateRecord, now: datetime, ttl: int | None = None) -> OrderStateRecord:
    """A terminal record's status (and alert) has been sent: the order is finished, and from now on it expires after
    `ttl` seconds (Cosmos DB per-item TTL; None: kept forever; a kept order keeps TTL_NEVER). Repeating it is a no-op.
    Not a state change."""
    if rec.process_state not in TERMINAL_STATES:
        raise IllegalTransition(f"order {rec.order_id} is {rec.process_state.value}: nothing to notify yet")
    if rec.notified_at is not None:
        return rec
    expiry = rec.ttl if rec.ttl == TTL_NEVER else ttl
    return rec.model_copy(update={"notified_at": ensure_utc(now), "updated_at": ensure_utc(now), "ttl": expiry})


class Wrote:
    """A mutation that remembers whether its last application changed the record (what `update_with_retry` wrote):
    a repeated activity, or a repeated cancel, finds the record already moved and writes nothing."""

    def __init__(self, mutate: Callable[[OrderStateRecord], OrderStateRecord]) -> None:
        self._mutate = mutate
        self.changed = False
        self.before: ProcessState | None = None

    def __call__(self, rec: OrderStateRecord) -> OrderStateRecord:
        updated = self._mutate(rec)
        self.changed = updated is not rec
        self.before = rec.process_state
        return updated

    @property
    def left_processing(self) -> bool:
        """Whether the write this call made took the order out of Processing (what holds an admission slot)."""
        return self.changed and self.before is ProcessState.PROCESSING
