"""One Scheduler decision as one fenced state write (workflow version 3): record what the last step or compensation
answered, then move on — dispatch the next action with its CompleteBy, or end the order.

Every transition is one of `orderflow.state_machine`'s functions, composed here in memory; the store sees the
composition as one etag-guarded write (`update_with_retry` re-reads and re-applies it on a 412). Re-applying it to a
record it already wrote changes nothing, so a repeated activity writes nothing and re-sends a request that duplicate
detection absorbs. Pure: no I/O; activities/state.py does the reads, the write, the Agent request and the
notifications. Cost per order against version 2: docs/modules-product.md."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from orderflow.messages import Action, CompensationName, parse_action
from orderflow.records import TERMINAL_STATES, OrderStateRecord, ProcessState, StepStatus
from orderflow.state_machine import (
    CANCELLED_PREFIX,
    begin_compensation,
    cancel_pending,
    complete,
    fail,
    fence,
    record_step,
    set_step_deadline,
)


@dataclass(frozen=True)
class StepResult:
    """What the Agent answered for the action the Scheduler last dispatched (a success or a permanent failure; a
    transient failure or "not now" never reaches ADVANCE_ORDER). `cause`: the failure's reason as the record and the
    alert show it."""

    action: Action
    succeeded: bool
    error: str | None = None
    cause: str | None = None
    undone: bool | None = None  # a compensation's: whether the remote had an effect to undo

    @classmethod
    def from_request(cls, data: dict[str, object]) -> StepResult:
        status = StepStatus(str(data["status"]))
        if status not in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            raise ValueError(f"result.status must be succeeded or failed, got {status.value!r}")
        error, cause, undone = data.get("error"), data.get("cause"), data.get("undone")
        return cls(
            parse_action(data["step"]),
            status is StepStatus.SUCCEEDED,
            None if error is None else str(error),
            None if cause is None else str(cause),
            None if undone is None else bool(undone),
        )


@dataclass(frozen=True)
class Decision:
    """The record to write and what the Scheduler does next: `send` an action (its CompleteBy is the one the
    Scheduler passed in), or nothing — the record is terminal."""

    record: OrderStateRecord
    send: Action | None

    @property
    def done(self) -> bool:
        return self.send is None


def _in_phase(rec: OrderStateRecord, action: Action) -> bool:
    """Whether `action`'s result is still to be recorded: a step while Processing, a compensation while
    CompensationInProgress. Otherwise this decision was written already (the record moved on with it: into
    compensation, or to its end) and a repeat must not record it again."""
    if isinstance(action, CompensationName):
        return rec.process_state is ProcessState.COMPENSATING
    return rec.process_state is ProcessState.PROCESSING


def _next_action(rec: OrderStateRecord) -> Action | None:
    """The first of the record's own steps (Processing) or compensations (CompensationInProgress) not yet succeeded;
    None: all done. A record keeps the steps it was created with, so a step added later never reaches it."""
    if rec.process_state is ProcessState.COMPENSATING:
        return next((c.name for c in rec.compensations if c.status is not StepStatus.SUCCEEDED), None)
    return next((s.name for s in rec.steps if s.status is not StepStatus.SUCCEEDED), None)


def advance(
    rec: OrderStateRecord,
    instance: str,
    result: StepResult | None,
    complete_by: datetime,
    now: datetime,
    workflow_version: str,
    cancel: bool = False,
) -> Decision:
    """Fenced on LockedBy == `instance` (Fenced otherwise). `result`: the last action's answer (None at the start of
    an attempt, or after the client's cancel won the Scheduler's race, `cancel`). A cancel recorded for the running
    attempt is honoured here, at a decision point of the forward path, as version 2 did at each step's deadline and
    at the finish."""
    fence(rec, instance)
    if result is not None and _in_phase(rec, result.action):
        rec = record_step(
            rec,
            instance,
            result.action,
            StepStatus.SUCCEEDED if result.succeeded else StepStatus.FAILED,
            now,
            error=result.error,
            undone=result.undone,
        )
        if not result.succeeded:
            reason = result.cause or f"{result.action.value}: PermanentFailure: {result.error or ''}".strip()
            rec = (
                fail(rec, instance, reason, now)
                if isinstance(result.action, CompensationName)
                else begin_compensation(rec, instance, reason, complete_by, now)
            )
    if cancel or cancel_pending(rec, instance):
        if rec.process_state is ProcessState.PROCESSING:
            rec = begin_compensation(rec, instance, CANCELLED_PREFIX, complete_by, now)
    if rec.process_state in TERMINAL_STATES:
        return Decision(rec, None)
    action = _next_action(rec)
    if action is None:
        return Decision(complete(rec, instance, now), None)
    return Decision(set_step_deadline(rec, instance, action, complete_by, now, workflow_version), action)
