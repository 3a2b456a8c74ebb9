"""The Scheduler: one attempt of one order, as a Durable orchestration with instance id `<orderId>:<attempt>`.

For each step it sets the step's CompleteBy (fenced), sends the request to the Agent, then races a durable timer at
CompleteBy against the Agent's reply event and cancels the timer when the reply wins. Every state-store update is
an activity fenced on LockedBy == this instance id; a superseded attempt stops quietly. When the timer wins, the
attempt ends without touching the record: the Supervisor finds the expired CompleteBy and recovers it.

Compensation (workflow version 2): when a step fails permanently, or a client cancels, the Scheduler undoes the
steps it sent, newest first, through the same Agent path, fencing, race and idempotency keys (one per order and
compensation). A cancel reaches the running attempt as the external event `CancelOrder` (it wins the race) or, at
the next step, through the record (SET_STEP_DEADLINE answers "cancel").

Versioning: the code branches on the orchestration's version (`context.version`, from ExecutionStarted.Version, else
the input's `workflowVersion`): an instance started under version 1 replays and finishes on the version-1 path, exactly
as that code scheduled it (tests/unit/test_workflow_versions.py replays its recorded histories).

Durable rules (seed 004): time from `context.current_utc_datetime`, no I/O, log only when not replaying.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from datetime import datetime, timedelta
from typing import Any

import azure.durable_functions as df
from azure.durable_functions.models.Task import TaskBase

from orderflow import function_names as fn
from orderflow.breaker import CIRCUIT_OPEN
from orderflow.messages import (
    STEPS,
    Action,
    AgentOutcome,
    AgentReply,
    CompensationName,
    StepName,
    idempotency_key,
    parse_action,
    reply_event_name,
)
from orderflow.records import ProcessState
from orderflow.state_machine import CANCELLED_PREFIX  # the cause a cancel gives BEGIN_COMPENSATION
from orderflow.workflow import (
    CANCEL_EVENT,
    PLAN,
    SUCCEEDED_STEPS,
    WORKFLOW_V1,
    WORKFLOW_V2,
    Outcome,
    WorkflowInput,
)

bp = df.Blueprint()
log = logging.getLogger("orderflow.scheduler")


def _log(context: df.DurableOrchestrationContext, message: str, *args: Any) -> None:
    if not context.is_replaying:
        log.info(message, *args)


# Every activity is idempotent, so a failure (store or bus briefly unavailable) is retried here, in the Scheduler,
# before it can cost an attempt: 3 tries, 1 s apart (the Python SDK's RetryOptions has no backoff coefficient) —
# well inside a step's CompleteBy. A remote-service
# failure never surfaces as an activity failure (the Agent reports it in its reply), so this does not multiply the
# Agent's retries.
ACTIVITY_RETRY = df.RetryOptions(first_retry_interval_in_milliseconds=1000, max_number_of_attempts=3)


def _call(context: df.DurableOrchestrationContext, name: str, payload: dict[str, Any]) -> TaskBase:
    return context.call_activity_with_retry(name, ACTIVITY_RETRY, payload)


def _failure_cause(action: Action, reply: AgentReply) -> str:
    """A permanent failure as the record, the status and the alert name it: `<action>: <code>: <error>`."""
    return f"{action.value}: {reply.error_code or 'PermanentFailure'}: {reply.error or ''}".strip()


def _forget_buffered_event(context: df.DurableOrchestrationContext, name: str) -> None:
    """Drop the SDK's buffered copy of an event the Scheduler has just received, so that it is received once.

    azure-functions-durable-python #507 (open): an EventRaised that arrives while nothing waits for its name is kept
    in `context.deferred_tasks[name]` (TaskOrchestrationExecutor.set_task_value), and every later
    `wait_for_external_event(name)` is completed from that entry, which the SDK never removes
    (DurableOrchestrationContext._add_to_open_tasks). The wait loop below waits again on the same name after an
    ignored reply, so without this the ignored reply would come back at once, forever (a RecursionError that fails
    the orchestration), and the valid reply would never be read. A buffered entry, if any, is exactly the event the
    wait just received: a wait registered while an entry exists is completed from it, and an event arriving while a
    wait is open goes to that wait. Deterministic on replay. Only the SDK's one-callback-per-name form is removed:
    should a fixed SDK queue several events per name, they are left alone. tests/devhost_durable/
    test_scheduler_events.py proves it on devhost through the real SDK.
    """
    deferred = getattr(context, "deferred_tasks", None)
    if isinstance(deferred, dict) and callable(deferred.get(name)):
        del deferred[name]


def run_step(context: df.DurableOrchestrationContext, inp: WorkflowInput, step: StepName,
             order: dict[str, Any]) -> Generator[TaskBase, Any, AgentReply | Outcome]:
    """Version 1: one step: fenced deadline, Agent request, then the race between the timer and the reply."""
    instance_id = context.instance_id
    complete_by = context.current_utc_datetime + timedelta(seconds=inp.step_timeout_seconds)
    fenced_ok = yield _call(context, fn.SET_STEP_DEADLINE, {
        "orderId": inp.order_id, "instanceId": instance_id, "step": step.value, "completeBy": complete_by.isoformat()})
    if not fenced_ok:
        return Outcome.SUPERSEDED
    yield _call(context, fn.SEND_AGENT_REQUEST, {
        "instanceId": instance_id, "orderId": inp.order_id, "attempt": inp.attempt, "step": step.value,
        "idempotencyKey": idempotency_key(inp.order_id, step.value), "deadline": complete_by.isoformat(),
        "maxRetries": inp.agent_retries,
        "payload": order})
    return (yield from _race(context, step, complete_by, None))  # version 1 has no cancel


def workflow_version(context: df.DurableOrchestrationContext, inp: WorkflowInput) -> str:
    """The version this instance runs: ExecutionStarted.Version (host.json defaultVersion or start_new(version=)),
    else the input's (an extension without orchestration versions leaves it "")."""
    return getattr(context, "version", None) or inp.workflow_version


@bp.function_name(fn.ORDER_WORKFLOW)
@bp.orchestration_trigger(context_name="context")
def order_workflow(context: df.DurableOrchestrationContext) -> Generator[TaskBase, Any, dict[str, Any]]:
    inp = WorkflowInput.model_validate(context.get_input())
    version = workflow_version(context, inp)
    if version == WORKFLOW_V1:
        return (yield from order_workflow_v1(context, inp))
    if version == WORKFLOW_V2:
        return (yield from order_workflow_v2(context, inp, version))
    return (yield from order_workflow_v3(context, inp, version))


def order_workflow_v1(context: df.DurableOrchestrationContext,
                      inp: WorkflowInput) -> Generator[TaskBase, Any, dict[str, Any]]:
    """Version 1, as it was: no compensation, no cancel."""
    instance_id = context.instance_id
    loaded = yield _call(context, fn.LOAD_ORDER, {"orderId": inp.order_id, "instanceId": instance_id})
    if loaded is None:
        return {"outcome": Outcome.SUPERSEDED.value}
    done = set(loaded.get(SUCCEEDED_STEPS, ()))
    order = {k: v for k, v in loaded.items() if k != SUCCEEDED_STEPS}
    for step in STEPS:
        if step.value in done:
            continue  # an earlier attempt completed it: never call the remote service for it again
        context.set_custom_status({"step": step.value, "attempt": inp.attempt})
        result = yield from run_step(context, inp, step, order)
        if isinstance(result, Outcome):
            return {"outcome": result.value, "step": step.value}
        reply: AgentReply = result
        if reply.outcome is AgentOutcome.FAILED and reply.error_code == CIRCUIT_OPEN:
            # "Not now": the Agent made no call because the remote service's breaker is open. The attempt ends
            # without a FailureCount; the order waits in Pending for the breaker (orderflow/breaker.py).
            retry_after = float(reply.result.get("retryAfterSeconds", inp.step_timeout_seconds))
            deferred = yield _call(context, fn.DEFER_ORDER, {
                "orderId": inp.order_id, "instanceId": instance_id, "step": step.value,
                "retryAfterSeconds": retry_after,
                # From the orchestration's clock, so a resent activity writes the same record (an idempotent no-op).
                "retryAt": (context.current_utc_datetime + timedelta(seconds=retry_after)).isoformat(),
                "reason": f"{step.value}: {CIRCUIT_OPEN}: {reply.error or ''}".strip()})
            outcome = Outcome.DEFERRED if deferred else Outcome.SUPERSEDED
            return {"outcome": outcome.value, "step": step.value}
        if reply.outcome is AgentOutcome.FAILED and not reply.permanent:
            # Transient failure that the Agent could not absorb within the deadline: leave the record Processing
            # with its CompleteBy; the Supervisor owns the retry (one retry owner, seed 003).
            return {"outcome": Outcome.TIMED_OUT.value, "step": step.value, "error": reply.error}
        recorded = yield _call(context, fn.RECORD_STEP_RESULT, {
            "orderId": inp.order_id, "instanceId": instance_id, "step": step.value,
            "status": "succeeded" if reply.outcome is AgentOutcome.SUCCEEDED else "failed", "error": reply.error})
        if not recorded:
            return {"outcome": Outcome.SUPERSEDED.value, "step": step.value}
        if reply.outcome is AgentOutcome.FAILED:
            finished = yield _call(context, fn.FINISH_ORDER, {
                "orderId": inp.order_id, "instanceId": instance_id, "attempt": inp.attempt, "outcome": "failed",
                "reason": _failure_cause(step, reply)})
            outcome = Outcome.FAILED if finished else Outcome.SUPERSEDED
            return {"outcome": outcome.value, "step": step.value}
    finished = yield _call(context, fn.FINISH_ORDER, {
        "orderId": inp.order_id, "instanceId": instance_id, "attempt": inp.attempt, "outcome": "completed",
        "reason": "all steps succeeded"})
    context.set_custom_status({"step": None, "attempt": inp.attempt})
    return {"outcome": (Outcome.COMPLETED if finished else Outcome.SUPERSEDED).value}


# --- version 2: compensation and cancel ------------------------------------------------------------------------


def _race_step(context: df.DurableOrchestrationContext, inp: WorkflowInput, action: Action, order: dict[str, Any],
               version: str, cancel: TaskBase | None) -> Generator[TaskBase, Any, AgentReply | Outcome]:
    """One step or compensation: fenced deadline (which also reports a recorded cancel), Agent request, then the race
    between the timer, the reply and (for a forward step) the client's cancel."""
    instance_id = context.instance_id
    complete_by = context.current_utc_datetime + timedelta(seconds=inp.step_timeout_seconds)
    fenced = yield _call(context, fn.SET_STEP_DEADLINE, {
        "orderId": inp.order_id, "instanceId": instance_id, "step": action.value, "completeBy": complete_by.isoformat(),
        "workflowVersion": version, "honoursCancel": cancel is not None})
    if fenced == CANCEL_REQUESTED:
        return Outcome.CANCELLED
    if not fenced:
        return Outcome.SUPERSEDED
    yield _call(context, fn.SEND_AGENT_REQUEST, {
        "instanceId": instance_id, "orderId": inp.order_id, "attempt": inp.attempt, "step": action.value,
        "idempotencyKey": idempotency_key(inp.order_id, action.value), "deadline": complete_by.isoformat(),
        "maxRetries": inp.agent_retries, "payload": order})
    return (yield from _race(context, action, complete_by, cancel))


def _race(context: df.DurableOrchestrationContext, action: Action, complete_by: datetime,
          cancel: TaskBase | None) -> Generator[TaskBase, Any, AgentReply | Outcome]:
    """The race between the timer at CompleteBy, the Agent's reply and (for a forward step) the client's cancel. A
    reply for another instance or action, or a malformed one, is ignored and the wait goes on."""
    instance_id = context.instance_id
    timer = context.create_timer(complete_by)
    event_name = reply_event_name(action.value)
    while True:
        reply_task = context.wait_for_external_event(event_name)
        winner = yield context.task_any([reply_task, timer, *([cancel] if cancel is not None else [])])
        if winner is timer:
            _log(context, "%s: %s timed out at %s", instance_id, action.value, complete_by)
            return Outcome.TIMED_OUT
        if cancel is not None and winner is cancel:
            timer.cancel()
            _log(context, "%s: cancelled during %s", instance_id, action.value)
            return Outcome.CANCELLED
        _forget_buffered_event(context, event_name)  # SDK #507: else an ignored reply comes back on the next wait
        try:
            reply = AgentReply.from_event(reply_task.result)  # a str today (SDK #295), a dict if it is fixed
        except ValueError:
            _log(context, "%s: ignoring a malformed reply for %s", instance_id, action.value)
            continue
        if reply.instance_id == instance_id and reply.step == action:
            timer.cancel()
            return reply
        _log(context, "%s: ignoring a reply for %s/%s", instance_id, reply.instance_id, reply.step)


# What SET_STEP_DEADLINE answers (version 2) when the record says the client cancelled: nothing was set or sent.
CANCEL_REQUESTED = "cancel"


def _not_now(context: df.DurableOrchestrationContext, inp: WorkflowInput, action: Action,
             reply: AgentReply) -> Generator[TaskBase, Any, dict[str, Any]]:
    """"Not now": the Agent made no call because the remote service's breaker is open. The attempt ends without a
    FailureCount; the order (or its compensation) waits for the breaker (orderflow/breaker.py)."""
    retry_after = float(reply.result.get("retryAfterSeconds", inp.step_timeout_seconds))
    deferred = yield _call(context, fn.DEFER_ORDER, {
        "orderId": inp.order_id, "instanceId": context.instance_id, "step": action.value,
        "retryAfterSeconds": retry_after,
        # From the orchestration's clock, so a resent activity writes the same record (an idempotent no-op).
        "retryAt": (context.current_utc_datetime + timedelta(seconds=retry_after)).isoformat(),
        "reason": f"{action.value}: {CIRCUIT_OPEN}: {reply.error or ''}".strip()})
    return {"outcome": (Outcome.DEFERRED if deferred else Outcome.SUPERSEDED).value, "step": action.value}


def _record(context: df.DurableOrchestrationContext, inp: WorkflowInput, action: Action,
            reply: AgentReply) -> Generator[TaskBase, Any, dict[str, Any] | None]:
    """A step's or compensation's reply: "not now" (the breaker) defers, a transient failure the Agent could not
    absorb within the deadline leaves the record with its CompleteBy (the Supervisor owns the retry, one retry owner,
    seed 003); otherwise the outcome is recorded (fenced; a compensation with the remote's `undone`). None: go on."""
    if reply.outcome is AgentOutcome.FAILED and reply.error_code == CIRCUIT_OPEN:
        return (yield from _not_now(context, inp, action, reply))
    if reply.outcome is AgentOutcome.FAILED and not reply.permanent:
        return {"outcome": Outcome.TIMED_OUT.value, "step": action.value, "error": reply.error}
    succeeded = reply.outcome is AgentOutcome.SUCCEEDED
    request: dict[str, Any] = {"orderId": inp.order_id, "instanceId": context.instance_id, "step": action.value,
                               "status": "succeeded" if succeeded else "failed", "error": reply.error}
    if isinstance(action, CompensationName):
        request["undone"] = bool(reply.result.get("undone")) if succeeded else None
    recorded = yield _call(context, fn.RECORD_STEP_RESULT, request)
    return None if recorded else {"outcome": Outcome.SUPERSEDED.value, "step": action.value}


def _finish(context: df.DurableOrchestrationContext, inp: WorkflowInput, order: dict[str, Any], version: str,
            outcome: str, reason: str, done: Outcome) -> Generator[TaskBase, Any, dict[str, Any]]:
    """FINISH_ORDER. The forward path's completion is a decision point too: a cancel recorded while the last step
    ran is honoured (the activity answers "cancel" and writes nothing), so an accepted cancel is never dropped."""
    forward = done is Outcome.COMPLETED
    finished = yield _call(context, fn.FINISH_ORDER, {
        "orderId": inp.order_id, "instanceId": context.instance_id, "attempt": inp.attempt, "outcome": outcome,
        "reason": reason, **({"honoursCancel": True} if forward else {})})
    if forward and finished == CANCEL_REQUESTED:
        return (yield from _undo(context, inp, order, version, CANCELLED_PREFIX))
    context.set_custom_status({"step": None, "attempt": inp.attempt})
    return {"outcome": (done if finished else Outcome.SUPERSEDED).value}


def order_workflow_v2(context: df.DurableOrchestrationContext, inp: WorkflowInput,
                      version: str) -> Generator[TaskBase, Any, dict[str, Any]]:
    cancel = context.wait_for_external_event(CANCEL_EVENT)
    loaded = yield _call(context, fn.LOAD_ORDER, {"orderId": inp.order_id, "instanceId": context.instance_id})
    if loaded is None:
        return {"outcome": Outcome.SUPERSEDED.value}
    done = set(loaded.get(SUCCEEDED_STEPS, ()))
    plan = loaded.get(PLAN) or {}
    order = {k: v for k, v in loaded.items() if k not in (SUCCEEDED_STEPS, PLAN)}
    if "compensations" in plan:  # a compensation claimed by the Starter (after the Supervisor or a cancel)
        return (yield from _compensate(context, inp, order, version, plan["compensations"]))
    for step in STEPS:
        if step.value in done:
            continue  # an earlier attempt completed it: never call the remote service for it again
        context.set_custom_status({"step": step.value, "attempt": inp.attempt})
        result = yield from _race_step(context, inp, step, order, version, cancel)
        if result is Outcome.CANCELLED:
            return (yield from _undo(context, inp, order, version, CANCELLED_PREFIX))
        if isinstance(result, Outcome):
            return {"outcome": result.value, "step": step.value}
        reply: AgentReply = result
        ended = yield from _record(context, inp, step, reply)
        if ended is not None:
            return ended
        if reply.outcome is AgentOutcome.FAILED:
            return (yield from _undo(context, inp, order, version, _failure_cause(step, reply)))
    return (yield from _finish(context, inp, order, version, "completed", "all steps succeeded",
                                   Outcome.COMPLETED))


def _undo(context: df.DurableOrchestrationContext, inp: WorkflowInput, order: dict[str, Any], version: str,
          cause: str) -> Generator[TaskBase, Any, dict[str, Any]]:
    """Begin compensation (fenced): the activity moves the record and answers the compensations to run, newest step
    first; [] when nothing was sent (the order ended Cancelled or Error, notified by the activity)."""
    complete_by = context.current_utc_datetime + timedelta(seconds=inp.step_timeout_seconds)
    names = yield _call(context, fn.BEGIN_COMPENSATION, {
        "orderId": inp.order_id, "instanceId": context.instance_id, "cause": cause,
        "completeBy": complete_by.isoformat()})
    if names is None:
        return {"outcome": Outcome.SUPERSEDED.value}
    if not names:
        return {"outcome": (Outcome.CANCELLED if cause == CANCELLED_PREFIX else Outcome.FAILED).value}
    return (yield from _compensate(context, inp, order, version, names))


def _compensate(context: df.DurableOrchestrationContext, inp: WorkflowInput, order: dict[str, Any], version: str,
                names: list[str]) -> Generator[TaskBase, Any, dict[str, Any]]:
    for name in names:
        action = CompensationName(name)
        context.set_custom_status({"compensation": action.value, "attempt": inp.attempt})
        result = yield from _race_step(context, inp, action, order, version, None)
        if isinstance(result, Outcome):  # timed out or superseded: the Supervisor retries the compensation
            return {"outcome": result.value, "step": action.value}
        reply: AgentReply = result
        ended = yield from _record(context, inp, action, reply)
        if ended is not None:
            return ended
        if reply.outcome is AgentOutcome.FAILED:
            return (yield from _finish(context, inp, order, version, "failed", _failure_cause(action, reply),
                                       Outcome.COMPENSATION_FAILED))
    return (yield from _finish(context, inp, order, version, "completed", "compensated", Outcome.COMPENSATED))


# --- version 3: one activity per decision point ----------------------------------------------------------------
# ADVANCE_ORDER's answer `{"done": state}` as the orchestration's outcome.
DONE_OUTCOMES = {ProcessState.PROCESSED.value: Outcome.COMPLETED, ProcessState.ERROR.value: Outcome.FAILED,
                 ProcessState.CANCELLED.value: Outcome.CANCELLED, ProcessState.COMPENSATED.value: Outcome.COMPENSATED,
                 ProcessState.COMPENSATION_FAILED.value: Outcome.COMPENSATION_FAILED}


def _result(action: Action, reply: AgentReply) -> dict[str, Any]:
    """A success or permanent failure as ADVANCE_ORDER records it."""
    succeeded = reply.outcome is AgentOutcome.SUCCEEDED
    result: dict[str, Any] = {"step": action.value, "status": "succeeded" if succeeded else "failed",
                              "error": reply.error}
    if not succeeded:
        result["cause"] = _failure_cause(action, reply)
    if isinstance(action, CompensationName):
        result["undone"] = bool(reply.result.get("undone")) if succeeded else None
    return result


def order_workflow_v3(context: df.DurableOrchestrationContext, inp: WorkflowInput,
                      version: str) -> Generator[TaskBase, Any, dict[str, Any]]:
    """Each decision point is one ADVANCE_ORDER (orderflow/advance.py): it records the last reply, honours a cancel,
    and sets the next step's (or compensation's) CompleteBy and sends its request — or ends the order. Between two
    decisions the same race as version 2: the timer at CompleteBy, the Agent's reply, and for a forward step the
    client's cancel. Steps an earlier attempt completed are skipped by the activity (never called again), and a
    compensation claimed by the Starter starts at its first compensation still to run."""
    cancel = context.wait_for_external_event(CANCEL_EVENT)
    base = {"orderId": inp.order_id, "instanceId": context.instance_id, "attempt": inp.attempt,
            "workflowVersion": version, "agentRetries": inp.agent_retries,
            **({"traceparent": inp.traceparent} if inp.traceparent else {})}  # each activity's span joins the trace
    result: dict[str, Any] | None = None
    cancelled = False
    while True:
        complete_by = context.current_utc_datetime + timedelta(seconds=inp.step_timeout_seconds)
        decided = yield _call(context, fn.ADVANCE_ORDER, {**base, "completeBy": complete_by.isoformat(),
                                                          "result": result, "cancel": cancelled})
        if decided is None:
            return {"outcome": Outcome.SUPERSEDED.value}
        if "done" in decided:
            context.set_custom_status({"step": None, "attempt": inp.attempt})
            return {"outcome": DONE_OUTCOMES[decided["done"]].value}
        action = parse_action(decided["send"])
        forward = isinstance(action, StepName)
        context.set_custom_status({"step" if forward else "compensation": action.value, "attempt": inp.attempt})
        raced = yield from _race(context, action, complete_by, cancel if forward and not cancel.is_completed else None)
        if raced is Outcome.CANCELLED:
            result, cancelled = None, True
            continue
        if isinstance(raced, Outcome):  # timed out: the Supervisor recovers the expired CompleteBy
            return {"outcome": raced.value, "step": action.value}
        reply: AgentReply = raced
        if reply.outcome is AgentOutcome.FAILED and reply.error_code == CIRCUIT_OPEN:
            return (yield from _not_now(context, inp, action, reply))
        if reply.outcome is AgentOutcome.FAILED and not reply.permanent:
            return {"outcome": Outcome.TIMED_OUT.value, "step": action.value, "error": reply.error}
        result, cancelled = _result(action, reply), False
