"""The Scheduler: one attempt of one order, as a Durable orchestration with instance id `<orderId>:<attempt>`.

Each decision point is one ADVANCE_ORDER activity (orderflow/advance.py): it records the last reply, honours a
cancel, and sets the next step's (or compensation's) CompleteBy and sends its request, or ends the order. Between
two decisions the Scheduler races a durable timer at CompleteBy against the Agent's reply and, for a forward step,
the client's cancel (the external event `CancelOrder`). When the timer wins, the attempt ends without touching the
record: the Supervisor recovers it. The steps are the record's own (README, "Versioning"); an instance started under
version 1, 2 or 3 replays on its frozen path (orchestrators/frozen_versions.py). Activities take and return the typed
models of orderflow/activity_models.py, as plain JSON. More: docs/modules-product.md."""

from __future__ import annotations

from collections.abc import Generator
from datetime import timedelta
from typing import Any

import azure.durable_functions as df
from azure.durable_functions.models.Task import TaskBase

from orchestrators.frozen_versions import order_workflow_v1, order_workflow_v2, order_workflow_v3
from orchestrators.scheduling import ACTIVITY_RETRY, call, failure_cause, not_now, race
from orderflow import function_names as fn
from orderflow.activity_models import (
    ActionResult,
    AdvanceOrderInput,
    AdvanceOrderResult,
    SchedulerStatus,
    WorkflowResult,
)
from orderflow.breaker import CIRCUIT_OPEN
from orderflow.messages import AgentOutcome, AgentReply, StepName
from orderflow.records import ProcessState
from orderflow.workflow import CANCEL_EVENT, WORKFLOW_V1, WORKFLOW_V2, WORKFLOW_V3, Outcome, WorkflowInput

__all__ = ["ACTIVITY_RETRY", "DONE_OUTCOMES", "bp", "order_workflow", "order_workflow_v4", "workflow_version"]

bp = df.Blueprint()

# ADVANCE_ORDER's `done` state as the orchestration's outcome.
DONE_OUTCOMES = {
    ProcessState.PROCESSED: Outcome.COMPLETED,
    ProcessState.ERROR: Outcome.FAILED,
    ProcessState.CANCELLED: Outcome.CANCELLED,
    ProcessState.COMPENSATED: Outcome.COMPENSATED,
    ProcessState.COMPENSATION_FAILED: Outcome.COMPENSATION_FAILED,
}


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
    if version == WORKFLOW_V3:
        return (yield from order_workflow_v3(context, inp, version))
    return (yield from order_workflow_v4(context, inp, version))


def order_workflow_v4(
    context: df.DurableOrchestrationContext, inp: WorkflowInput, version: str
) -> Generator[TaskBase, Any, dict[str, Any]]:
    """Decide, race, decide again until ADVANCE_ORDER ends the order. Steps an earlier attempt completed are skipped
    by the activity (never called again), and a compensation claimed by the Starter starts at its first compensation
    still to run. Version 3's actions, except after an ignored reply: a fresh timer (scheduling.py `race`)."""
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
            return WorkflowResult(outcome=DONE_OUTCOMES[decided.done]).to_dict()
        action = decided.action()
        forward = isinstance(action, StepName)
        status = (
            SchedulerStatus(step=action, attempt=inp.attempt)
            if forward
            else SchedulerStatus(compensation=action, attempt=inp.attempt)
        )
        context.set_custom_status(status.to_dict())
        raced = yield from race(context, action, complete_by, cancel if forward and not cancel.is_completed else None)
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
