"""The Scheduler's replay-only versions 1, 2 and 3, frozen: they finish the instances started under them.

`order_workflow` (orchestrators/order_workflow.py) runs an instance here when its version is "1.0" (or empty), "2.0"
or "3.0". This code schedules exactly what it scheduled when those versions were live (tests/product/unit/
test_workflow_versions.py replays their recorded histories), so it never changes: its own race (`frozen_race`), its
own copy of the three steps of versions 1 and 2 (`FROZEN_STEPS`), never the shared `STEPS`, and the activities of
activities/frozen_versions.py. Delete a version once none of its instances is in flight (README, "Versioning").
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime, timedelta
from typing import Any, cast

import azure.durable_functions as df
from azure.durable_functions.models.Task import TaskBase, TimerTask

from orchestrators.scheduling import call, failure_cause, forget_buffered_event, log_live, not_now
from orderflow import function_names as fn
from orderflow.activity_models import (
    ActionResult,
    AdvanceOrderInput,
    AdvanceOrderResult,
    SchedulerStatus,
    WorkflowResult,
)
from orderflow.breaker import CIRCUIT_OPEN
from orderflow.messages import (
    Action,
    AgentOutcome,
    AgentReply,
    CompensationName,
    StepName,
    idempotency_key,
    reply_event_name,
)
from orderflow.records import ProcessState
from orderflow.state_machine import CANCELLED_PREFIX  # the cause a cancel gives BEGIN_COMPENSATION
from orderflow.workflow import CANCEL_EVENT, PLAN, SUCCEEDED_STEPS, Outcome, WorkflowInput

# The steps as versions 1 and 2 ran them: a literal copy, so that a step added to STEPS never reaches their replay.
FROZEN_STEPS: tuple[StepName, ...] = (StepName.RESERVE_INVENTORY, StepName.CHARGE_PAYMENT, StepName.ARRANGE_SHIPPING)


def frozen_race(
    context: df.DurableOrchestrationContext, action: Action, complete_by: datetime, cancel: TaskBase | None
) -> Generator[TaskBase, Any, AgentReply | Outcome]:
    """Versions 1 to 3: the race between one timer at CompleteBy, the Agent's reply and (for a forward step) the
    client's cancel; an ignored reply is waited for again against the same timer. On Azure such an instance stays
    Running after that timer wins, until another reply comes (docs/devhost.md, "Replay")."""
    instance_id = context.instance_id
    timer = cast(TimerTask, context.create_timer(complete_by))  # the SDK annotates TaskBase; it returns a TimerTask
    event_name = reply_event_name(action.value)
    while True:
        reply_task = context.wait_for_external_event(event_name)
        winner = yield context.task_any([reply_task, timer, *([cancel] if cancel is not None else [])])
        if winner is timer:
            log_live(context, "%s: %s timed out at %s", instance_id, action.value, complete_by)
            return Outcome.TIMED_OUT
        if cancel is not None and winner is cancel:
            timer.cancel()
            log_live(context, "%s: cancelled during %s", instance_id, action.value)
            return Outcome.CANCELLED
        forget_buffered_event(context, event_name)  # SDK #507: else an ignored reply comes back on the next wait
        try:
            reply = AgentReply.from_event(reply_task.result)  # a str today (SDK #295), a dict if it is fixed
        except ValueError:
            log_live(context, "%s: ignoring a malformed reply for %s", instance_id, action.value)
            continue
        if reply.instance_id == instance_id and reply.step == action:
            timer.cancel()
            return reply
        log_live(context, "%s: ignoring a reply for %s/%s", instance_id, reply.instance_id, reply.step)


# --- version 1: no compensation, no cancel ---------------------------------------------------------------------


def run_step(
    context: df.DurableOrchestrationContext, inp: WorkflowInput, step: StepName, order: dict[str, Any]
) -> Generator[TaskBase, Any, AgentReply | Outcome]:
    """Version 1: one step: fenced deadline, Agent request, then the race between the timer and the reply."""
    instance_id = context.instance_id
    complete_by = context.current_utc_datetime + timedelta(seconds=inp.step_timeout_seconds)
    fenced_ok = yield call(
        context,
        fn.SET_STEP_DEADLINE,
        {"orderId": inp.order_id, "instanceId": instance_id, "step": step.value, "completeBy": complete_by.isoformat()},
    )
    if not fenced_ok:
        return Outcome.SUPERSEDED
    yield call(
        context,
        fn.SEND_AGENT_REQUEST,
        {
            "instanceId": instance_id,
            "orderId": inp.order_id,
            "attempt": inp.attempt,
            "step": step.value,
            "idempotencyKey": idempotency_key(inp.order_id, step.value),
            "deadline": complete_by.isoformat(),
            "maxRetries": inp.agent_retries,
            "payload": order,
        },
    )
    return (yield from frozen_race(context, step, complete_by, None))  # version 1 has no cancel


def order_workflow_v1(
    context: df.DurableOrchestrationContext, inp: WorkflowInput
) -> Generator[TaskBase, Any, dict[str, Any]]:
    """Version 1, as it was: no compensation, no cancel."""
    instance_id = context.instance_id
    loaded = yield call(context, fn.LOAD_ORDER, {"orderId": inp.order_id, "instanceId": instance_id})
    if loaded is None:
        return {"outcome": Outcome.SUPERSEDED.value}
    done = set(loaded.get(SUCCEEDED_STEPS, ()))
    order = {k: v for k, v in loaded.items() if k != SUCCEEDED_STEPS}
    for step in FROZEN_STEPS:
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
            deferred = yield call(
                context,
                fn.DEFER_ORDER,
                {
                    "orderId": inp.order_id,
                    "instanceId": instance_id,
                    "step": step.value,
                    "retryAfterSeconds": retry_after,
                    # From the orchestration's clock, so a resent activity writes the same record (an idempotent no-op).
                    "retryAt": (context.current_utc_datetime + timedelta(seconds=retry_after)).isoformat(),
                    "reason": f"{step.value}: {CIRCUIT_OPEN}: {reply.error or ''}".strip(),
                },
            )
            outcome = Outcome.DEFERRED if deferred else Outcome.SUPERSEDED
            return {"outcome": outcome.value, "step": step.value}
        if reply.outcome is AgentOutcome.FAILED and not reply.permanent:
            # Transient failure that the Agent could not absorb within the deadline: leave the record Processing
            # with its CompleteBy; the Supervisor owns the retry (one retry owner, seed 003).
            return {"outcome": Outcome.TIMED_OUT.value, "step": step.value, "error": reply.error}
        recorded = yield call(
            context,
            fn.RECORD_STEP_RESULT,
            {
                "orderId": inp.order_id,
                "instanceId": instance_id,
                "step": step.value,
                "status": "succeeded" if reply.outcome is AgentOutcome.SUCCEEDED else "failed",
                "error": reply.error,
            },
        )
        if not recorded:
            return {"outcome": Outcome.SUPERSEDED.value, "step": step.value}
        if reply.outcome is AgentOutcome.FAILED:
            finished = yield call(
                context,
                fn.FINISH_ORDER,
                {
                    "orderId": inp.order_id,
                    "instanceId": instance_id,
                    "attempt": inp.attempt,
                    "outcome": "failed",
                    "reason": failure_cause(step, reply),
                },
            )
            outcome = Outcome.FAILED if finished else Outcome.SUPERSEDED
            return {"outcome": outcome.value, "step": step.value}
    finished = yield call(
        context,
        fn.FINISH_ORDER,
        {
            "orderId": inp.order_id,
            "instanceId": instance_id,
            "attempt": inp.attempt,
            "outcome": "completed",
            "reason": "all steps succeeded",
        },
    )
    context.set_custom_status({"step": None, "attempt": inp.attempt})
    return {"outcome": (Outcome.COMPLETED if finished else Outcome.SUPERSEDED).value}


# --- version 2: compensation and cancel ------------------------------------------------------------------------


def _race_step(
    context: df.DurableOrchestrationContext,
    inp: WorkflowInput,
    action: Action,
    order: dict[str, Any],
    version: str,
    cancel: TaskBase | None,
) -> Generator[TaskBase, Any, AgentReply | Outcome]:
    """One step or compensation: fenced deadline (which also reports a recorded cancel), Agent request, then the race
    between the timer, the reply and (for a forward step) the client's cancel."""
    instance_id = context.instance_id
    complete_by = context.current_utc_datetime + timedelta(seconds=inp.step_timeout_seconds)
    fenced = yield call(
        context,
        fn.SET_STEP_DEADLINE,
        {
            "orderId": inp.order_id,
            "instanceId": instance_id,
            "step": action.value,
            "completeBy": complete_by.isoformat(),
            "workflowVersion": version,
            "honoursCancel": cancel is not None,
        },
    )
    if fenced == CANCEL_REQUESTED:
        return Outcome.CANCELLED
    if not fenced:
        return Outcome.SUPERSEDED
    yield call(
        context,
        fn.SEND_AGENT_REQUEST,
        {
            "instanceId": instance_id,
            "orderId": inp.order_id,
            "attempt": inp.attempt,
            "step": action.value,
            "idempotencyKey": idempotency_key(inp.order_id, action.value),
            "deadline": complete_by.isoformat(),
            "maxRetries": inp.agent_retries,
            "payload": order,
        },
    )
    return (yield from frozen_race(context, action, complete_by, cancel))


# What SET_STEP_DEADLINE answers (version 2) when the record says the client cancelled: nothing was set or sent.
CANCEL_REQUESTED = "cancel"


def _record(
    context: df.DurableOrchestrationContext, inp: WorkflowInput, action: Action, reply: AgentReply
) -> Generator[TaskBase, Any, dict[str, Any] | None]:
    """A step's or compensation's reply: "not now" (the breaker) defers, a transient failure the Agent could not
    absorb within the deadline leaves the record with its CompleteBy (the Supervisor owns the retry, one retry owner,
    seed 003); otherwise the outcome is recorded (fenced; a compensation with the remote's `undone`). None: go on."""
    if reply.outcome is AgentOutcome.FAILED and reply.error_code == CIRCUIT_OPEN:
        return (yield from not_now(context, inp, action, reply))
    if reply.outcome is AgentOutcome.FAILED and not reply.permanent:
        return {"outcome": Outcome.TIMED_OUT.value, "step": action.value, "error": reply.error}
    succeeded = reply.outcome is AgentOutcome.SUCCEEDED
    request: dict[str, Any] = {
        "orderId": inp.order_id,
        "instanceId": context.instance_id,
        "step": action.value,
        "status": "succeeded" if succeeded else "failed",
        "error": reply.error,
    }
    if isinstance(action, CompensationName):
        request["undone"] = bool(reply.result.get("undone")) if succeeded else None
    recorded = yield call(context, fn.RECORD_STEP_RESULT, request)
    return None if recorded else {"outcome": Outcome.SUPERSEDED.value, "step": action.value}


def _finish(
    context: df.DurableOrchestrationContext,
    inp: WorkflowInput,
    order: dict[str, Any],
    version: str,
    outcome: str,
    reason: str,
    done: Outcome,
) -> Generator[TaskBase, Any, dict[str, Any]]:
    """FINISH_ORDER. The forward path's completion is a decision point too: a cancel recorded while the last step
    ran is honoured (the activity answers "cancel" and writes nothing), so an accepted cancel is never dropped."""
    forward = done is Outcome.COMPLETED
    finished = yield call(
        context,
        fn.FINISH_ORDER,
        {
            "orderId": inp.order_id,
            "instanceId": context.instance_id,
            "attempt": inp.attempt,
            "outcome": outcome,
            "reason": reason,
            **({"honoursCancel": True} if forward else {}),
        },
    )
    if forward and finished == CANCEL_REQUESTED:
        return (yield from _undo(context, inp, order, version, CANCELLED_PREFIX))
    context.set_custom_status({"step": None, "attempt": inp.attempt})
    return {"outcome": (done if finished else Outcome.SUPERSEDED).value}


def order_workflow_v2(
    context: df.DurableOrchestrationContext, inp: WorkflowInput, version: str
) -> Generator[TaskBase, Any, dict[str, Any]]:
    cancel = context.wait_for_external_event(CANCEL_EVENT)
    loaded = yield call(context, fn.LOAD_ORDER, {"orderId": inp.order_id, "instanceId": context.instance_id})
    if loaded is None:
        return {"outcome": Outcome.SUPERSEDED.value}
    done = set(loaded.get(SUCCEEDED_STEPS, ()))
    plan = loaded.get(PLAN) or {}
    order = {k: v for k, v in loaded.items() if k not in (SUCCEEDED_STEPS, PLAN)}
    if "compensations" in plan:  # a compensation claimed by the Starter (after the Supervisor or a cancel)
        return (yield from _compensate(context, inp, order, version, plan["compensations"]))
    for step in FROZEN_STEPS:
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
            return (yield from _undo(context, inp, order, version, failure_cause(step, reply)))
    return (yield from _finish(context, inp, order, version, "completed", "all steps succeeded", Outcome.COMPLETED))


def _undo(
    context: df.DurableOrchestrationContext, inp: WorkflowInput, order: dict[str, Any], version: str, cause: str
) -> Generator[TaskBase, Any, dict[str, Any]]:
    """Begin compensation (fenced): the activity moves the record and answers the compensations to run, newest step
    first; [] when nothing was sent (the order ended Cancelled or Error, notified by the activity)."""
    complete_by = context.current_utc_datetime + timedelta(seconds=inp.step_timeout_seconds)
    names = yield call(
        context,
        fn.BEGIN_COMPENSATION,
        {
            "orderId": inp.order_id,
            "instanceId": context.instance_id,
            "cause": cause,
            "completeBy": complete_by.isoformat(),
        },
    )
    if names is None:
        return {"outcome": Outcome.SUPERSEDED.value}
    if not names:
        return {"outcome": (Outcome.CANCELLED if cause == CANCELLED_PREFIX else Outcome.FAILED).value}
    return (yield from _compensate(context, inp, order, version, names))


def _compensate(
    context: df.DurableOrchestrationContext, inp: WorkflowInput, order: dict[str, Any], version: str, names: list[str]
) -> Generator[TaskBase, Any, dict[str, Any]]:
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
            return (
                yield from _finish(
                    context, inp, order, version, "failed", failure_cause(action, reply), Outcome.COMPENSATION_FAILED
                )
            )
    return (yield from _finish(context, inp, order, version, "completed", "compensated", Outcome.COMPENSATED))


# --- version 3: one ADVANCE_ORDER per decision point -------------------------------------------------------------

# ADVANCE_ORDER's `done` state as the orchestration's outcome, as version 3 had it.
_V3_DONE = {
    ProcessState.PROCESSED: Outcome.COMPLETED,
    ProcessState.ERROR: Outcome.FAILED,
    ProcessState.CANCELLED: Outcome.CANCELLED,
    ProcessState.COMPENSATED: Outcome.COMPENSATED,
    ProcessState.COMPENSATION_FAILED: Outcome.COMPENSATION_FAILED,
}


def order_workflow_v3(
    context: df.DurableOrchestrationContext, inp: WorkflowInput, version: str
) -> Generator[TaskBase, Any, dict[str, Any]]:
    """Version 3, as it was: decide, race, decide again until ADVANCE_ORDER ends the order."""
    cancel = context.wait_for_external_event(CANCEL_EVENT)
    result: ActionResult | None = None
    cancelled = False
    while True:
        complete_by = context.current_utc_datetime + timedelta(seconds=inp.step_timeout_seconds)
        answer = yield call(
            context,
            fn.ADVANCE_ORDER,
            AdvanceOrderInput.decision(inp, context.instance_id, version, complete_by, result, cancelled),
        )
        if answer is None:  # fenced out: a later attempt holds the record
            return WorkflowResult(outcome=Outcome.SUPERSEDED).to_dict()
        decided = AdvanceOrderResult.from_dict(answer)
        if decided.done is not None:
            context.set_custom_status(SchedulerStatus(step=None, attempt=inp.attempt).to_dict())
            return WorkflowResult(outcome=_V3_DONE[decided.done]).to_dict()
        action = decided.action()
        forward = isinstance(action, StepName)
        status = (
            SchedulerStatus(step=action, attempt=inp.attempt)
            if forward
            else SchedulerStatus(compensation=action, attempt=inp.attempt)
        )
        context.set_custom_status(status.to_dict())
        raced = yield from frozen_race(
            context, action, complete_by, cancel if forward and not cancel.is_completed else None
        )
        if raced is Outcome.CANCELLED:
            result, cancelled = None, True
            continue
        if isinstance(raced, Outcome):  # timed out: the Supervisor recovers the expired CompleteBy
            return WorkflowResult(outcome=raced, step=action).to_dict()
        reply: AgentReply = raced
        if reply.outcome is AgentOutcome.FAILED and reply.error_code == CIRCUIT_OPEN:
            return (yield from not_now(context, inp, action, reply))
        if reply.outcome is AgentOutcome.FAILED and not reply.permanent:
            return WorkflowResult(outcome=Outcome.TIMED_OUT, step=action, error=reply.error).to_dict()
        result, cancelled = ActionResult.of(action, reply, failure_cause(action, reply)), False
