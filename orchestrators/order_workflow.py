"""The Scheduler: one attempt of one order, as a Durable orchestration with instance id `<orderId>:<attempt>`.

For each step it sets the step's CompleteBy (fenced), sends the request to the Agent, then races a durable timer at
CompleteBy against the Agent's reply event and cancels the timer when the reply wins. Every state-store update is
an activity fenced on LockedBy == this instance id; a superseded attempt stops quietly. When the timer wins, the
attempt ends without touching the record: the Supervisor finds the expired CompleteBy and recovers it.

Durable rules (seed 004): time from `context.current_utc_datetime`, no I/O, log only when not replaying.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from datetime import timedelta
from typing import Any

import azure.durable_functions as df
from azure.durable_functions.models.Task import TaskBase

from orderflow import function_names as fn
from orderflow.breaker import CIRCUIT_OPEN
from orderflow.messages import STEPS, AgentOutcome, AgentReply, StepName, idempotency_key, reply_event_name
from orderflow.workflow import SUCCEEDED_STEPS, Outcome, WorkflowInput

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


def _matches(reply: AgentReply, instance_id: str, step: StepName) -> bool:
    return reply.instance_id == instance_id and reply.step == step


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
    """One step: fenced deadline, Agent request, then the race between the timer and the reply."""
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
    timer = context.create_timer(complete_by)
    event_name = reply_event_name(step.value)
    while True:
        reply_task = context.wait_for_external_event(event_name)
        winner = yield context.task_any([reply_task, timer])
        if winner is timer:
            _log(context, "%s: step %s timed out at %s", instance_id, step.value, complete_by)
            return Outcome.TIMED_OUT
        _forget_buffered_event(context, event_name)  # SDK #507: else an ignored reply comes back on the next wait
        try:
            reply = AgentReply.from_event(reply_task.result)  # a str today (SDK #295), a dict if it is fixed
        except ValueError:
            _log(context, "%s: ignoring a malformed reply for %s", instance_id, step.value)
            continue
        if _matches(reply, instance_id, step):
            timer.cancel()
            return reply
        _log(context, "%s: ignoring a reply for %s/%s", instance_id, reply.instance_id, reply.step)


@bp.function_name(fn.ORDER_WORKFLOW)
@bp.orchestration_trigger(context_name="context")
def order_workflow(context: df.DurableOrchestrationContext) -> Generator[TaskBase, Any, dict[str, Any]]:
    inp = WorkflowInput.model_validate(context.get_input())
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
                "reason": f"{step.value}: {reply.error_code or 'PermanentFailure'}: {reply.error or ''}".strip()})
            outcome = Outcome.FAILED if finished else Outcome.SUPERSEDED
            return {"outcome": outcome.value, "step": step.value}
    finished = yield _call(context, fn.FINISH_ORDER, {
        "orderId": inp.order_id, "instanceId": instance_id, "attempt": inp.attempt, "outcome": "completed",
        "reason": "all steps succeeded"})
    context.set_custom_status({"step": None, "attempt": inp.attempt})
    return {"outcome": (Outcome.COMPLETED if finished else Outcome.SUPERSEDED).value}
